"""`kermt serve`: trained models as an HTTP service on Ray Serve (FastAPI ingress, batched model replicas)."""
