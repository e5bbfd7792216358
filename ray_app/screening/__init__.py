"""`kermt predict`, `eval`, `fingerprint`, `embed`: streaming screening with Ray Data."""
