"""``python -m inference_server``: the same command line as ``inference-server``."""

from inference_server.cli import main

raise SystemExit(main())
