"""The process group: its supervisor (`scripts/serve`), the harness that tests, benchmarks
and the demo start groups with, and the demo."""
