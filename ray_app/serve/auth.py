"""Bearer-token auth of `kermt serve --api_key_env VAR`: the key is read from the environment on the driver, and
only its sha256 goes to the ingress replica (the key is in no Serve config, actor argument or log)."""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Optional

from fastapi import HTTPException

from kermt.errors import UserError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_api_key(variable: str) -> str:
    """The key held by environment variable ``variable`` (a UserError naming it when unset or empty)."""
    key = os.environ.get(variable, "").strip()
    if not key:
        raise UserError(f"--api_key_env {variable}: the environment variable {variable} is unset or empty; export "
                        f"the key first (e.g. export {variable}=$(openssl rand -hex 32))")
    return key


def check_bearer(authorization: Optional[str], expected_sha256: Optional[str]) -> None:
    """Nothing when auth is off or the header holds the key; else a 401 (compared in constant time)."""
    if expected_sha256 is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key_sha256(token.strip()), expected_sha256):
        raise HTTPException(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the "
                            "key kermt serve read from its --api_key_env variable",
                            headers={"WWW-Authenticate": "Bearer"})


def exposure_warning(host: str, api_key_env: Optional[str]) -> Optional[str]:
    """The one-line warning for an API listening beyond loopback without a key, else None."""
    if host in LOOPBACK_HOSTS or host.startswith("127.") or api_key_env:
        return None
    return (f"warning: --host {host} exposes the API to the network without authentication; anyone who reaches "
            "this port can use the models (add --api_key_env VAR)")


__all__ = ["check_bearer", "exposure_warning", "key_sha256", "read_api_key"]
