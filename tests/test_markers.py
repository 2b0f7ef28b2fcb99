"""The README's promise about markers: GPU-only tests are marked ``gpu`` and skipped on CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def _pytest(repo_root, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=repo_root,
                          capture_output=True, text=True, timeout=300)


def test_gpu_tests_exist_and_are_skipped_on_cpu(repo_root):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the gpu tests run here")
    listed = _pytest(repo_root, "--collect-only", "-q", "-m", "gpu", "tests/test_rollout_hf_gpu.py")
    assert listed.returncode == 0 and "test_cuda_greedy_equals_cpu_greedy" in listed.stdout, listed.stdout[-2000:]
    n = sum("::test_" in line for line in listed.stdout.splitlines())  # every gpu test of the file ...
    ran = _pytest(repo_root, "-q", "-rs", "tests/test_rollout_hf_gpu.py")
    assert n >= 2 and ran.returncode == 0 and f"{n} skipped" in ran.stdout and "needs a CUDA GPU" in ran.stdout, \
        ran.stdout[-2000:]  # ... skipped, none run and none failed
