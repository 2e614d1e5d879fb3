"""The README's "Use" snippet runs as written (on this machine's device: the CPU in CI)."""

import subprocess
import sys

from repo_paths import ROOT

README = ROOT / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_use_snippet_runs_as_written(tmp_path):
    script = tmp_path / "use.py"
    script.write_text(_python_block_after("## Use"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch.Size([1, 256])" in done.stdout
