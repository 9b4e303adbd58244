"""What a run leaves behind: metrics and progress lines (metrics.py), the end-of-run summary (summary.py), sharded
checkpoints and exact resume (checkpoint.py), HF exports (export.py), other libraries' startup notes (library_logs.py)."""
