"""`kermt explore`: model-guided selection of what to score next in a library, round by round on Ray."""
