"""A local S3 endpoint for tests: moto's server on 127.0.0.1 (as Ray's own storage tests use), with a bucket.

Clients find it through the standard AWS variables (:meth:`MotoS3.env`: endpoint and test credentials), so plain
``s3://bucket/prefix`` URIs work in pyarrow, Ray Train and Ray Tune without endpoint options.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port

BUCKET = "kermt-test"


@dataclass
class MotoS3:
    root: Path  # the server's working directory and log
    port: int = field(default_factory=free_port)
    _process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint}

    def start(self, bucket: str = BUCKET) -> "MotoS3":
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "s3.log", "w")
        self._process = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
                                          str(self.port)], stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.env()}, cwd=self.root)
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/", timeout=2).read()
                break
            except OSError as error:
                if time.time() > deadline:
                    raise RuntimeError(
                        f"moto_server did not start: {(self.root / 's3.log').read_text()[-2000:]}") from error
                time.sleep(0.3)
        self.make_bucket(bucket)
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=self.endpoint, access_key="testing", secret_key="testing",
                                 region="us-east-1", allow_bucket_creation=True)

    def make_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def listing(self, prefix: str) -> list[str]:
        """Every object key under ``s3://prefix`` (bucket/path)."""
        import pyarrow.fs as pafs

        infos = self.filesystem().get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File)
