"""Everything is in pyproject.toml except one step: the wheel also carries ``mixgemm-hf.pth`` at its top level
(site-packages), which registers mixgemm's checkpoint format with transformers at interpreter start-up
(src/_mixgemm_hf_hook.py), so a mixgemm checkpoint never loads as a silently random float model."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "mixgemm-hf.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH))


setup(cmdclass={"build_py": BuildPyWithPth})
