"""kermt.inputs.check_output_path: an output whose folder cannot be made or written is one UserError naming the flag
and the path, and the check leaves nothing behind."""

from __future__ import annotations

import os

import pytest

from kermt.errors import UserError
from kermt.inputs import check_output_path

AS_ROOT = os.geteuid() == 0  # root writes into a read-only (chmod) folder: the check must then pass, as the run would


def test_a_folder_under_proc_cannot_be_made_even_by_root():
    with pytest.raises(UserError) as raised:
        check_output_path("/proc/kermt-test/run/out.csv", "--output_path")
    assert str(raised.value) == ("--output_path /proc/kermt-test/run/out.csv: cannot create the folder "
                                 "/proc/kermt-test/run (No such file or directory); give a path in a folder you can "
                                 "write to")
    assert not os.path.exists("/proc/kermt-test")


def test_a_new_folder_passes_and_is_not_left_behind(tmp_path):
    check_output_path(tmp_path / "a" / "b" / "run", "--save_dir", directory=True)
    check_output_path(tmp_path / "c" / "out.csv", "--output_path")
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_is_named(tmp_path):
    (tmp_path / "taken").write_text("x")
    with pytest.raises(UserError, match=r"^--save_dir .*taken is a file; give a directory$"):
        check_output_path(tmp_path / "taken", "--save_dir", directory=True)
    with pytest.raises(UserError, match=r"taken/out\.csv: .*taken is a file, so the folder .*taken cannot be made$"):
        check_output_path(tmp_path / "taken" / "out.csv", "--output_path")


@pytest.mark.skipif(AS_ROOT, reason="root writes into a chmod 555 folder; /proc is the case root cannot write")
def test_a_read_only_folder_is_refused(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(UserError, match=r"cannot create the folder .*run \(Permission denied\)"):
            check_output_path(tmp_path / "run", "--save_dir", directory=True)
        with pytest.raises(UserError, match=r"cannot write in .* \(Permission denied\)"):
            check_output_path(tmp_path / "out.csv", "--output_path")
    finally:
        tmp_path.chmod(0o755)


@pytest.mark.skipif(not AS_ROOT, reason="what root may do")
def test_root_may_write_into_a_read_only_folder(tmp_path):
    tmp_path.chmod(0o555)
    try:
        check_output_path(tmp_path / "run" / "out.csv", "--output_path")
        assert list(tmp_path.iterdir()) == []
    finally:
        tmp_path.chmod(0o755)
