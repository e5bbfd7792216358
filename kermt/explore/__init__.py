"""`kermt explore` without Ray: batch sizes, acquisition functions, the ``--objective`` forms, the scorers that run
in this process and the explored.csv record (``ray_app.explore`` runs the rounds on a cluster)."""
