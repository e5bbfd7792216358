"""`kermt report PATH`: rebuild a run's report.html from the files it left (a finetune, tune or pretrain --save_dir,
or the --output_path of kermt eval or kermt predict), e.g. after copying the run down from object storage."""

from __future__ import annotations

import argparse
from pathlib import Path

from kermt.errors import UserError
from kermt.inputs import check_output_path
from ray_app.report.build import report_path, write_report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kermt report", description=__doc__)
    parser.add_argument("path",
                        help="a kermt finetune, tune or pretrain --save_dir, or the --output_path file of kermt eval "
                        "or kermt predict")
    parser.add_argument("--checkpoint_dir", default=None, metavar="MODEL",
                        help="for a kermt eval or predict output: the model that wrote it (its --checkpoint_dir or "
                        "--checkpoint_path), which colours the drawn molecules by attribution; without it they are "
                        "drawn plain (a finetune's report uses its own folds)")
    args = parser.parse_args(argv)
    if "://" in args.path:  # (ray_app.common.storage.is_uri would import Ray)
        raise UserError(f"kermt report {args.path}: reads local files; copy the run down first (e.g. aws s3 cp "
                        "--recursive, without the model files if you like) and give its local directory")
    if Path(args.path).exists():  # before the report is built: its folder may be a read-only copy
        check_output_path(report_path(Path(args.path)), "report", advice="the report goes beside what it reports "
                          "on: copy that to a folder you can write to")
    print(f"report: {write_report(args.path, model=args.checkpoint_dir)}", flush=True)
    return 0


__all__ = ["main"]
