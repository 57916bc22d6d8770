"""A client of tests/tools/structured_tool (JSON lines over a pipe), shared by the structured-output
reference tests."""

import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("TRIPOD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BIN = os.environ.get("TRIPOD_BIN", os.path.join(SRC, "build", "release", "tripod"))
TOOL = os.path.join(os.path.dirname(BIN), "tests", "structured_tool")


class StructuredTool:
    def __init__(self):
        self.proc = subprocess.Popen([TOOL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, encoding="utf-8")

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"structured_tool died on {req!r}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
