"""Write src/inference_server/openapi.json (served at /openapi.json) from docs/openapi.yaml, the source.

Run after editing the YAML: ``.venv/bin/python scripts/openapi.py``; a test fails while the two differ.
"""

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
document = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
(ROOT / "src" / "inference_server" / "openapi.json").write_text(json.dumps(document, indent=1) + "\n")
