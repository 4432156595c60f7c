"""Shared test set-up: offline checkpoints, and the engine fixtures most tests use."""

import os

# Never reach for a model hub; every checkpoint the suite uses is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

import minisgl  # noqa: E402,F401  (sets TRITON_INTERPRET before any kernel module is imported)
from tests._models import smollm2_dir, tiny_model_dir  # noqa: E402

TINY_ARCHS = ["llama", "qwen2", "qwen3", "qwen3_moe"]


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    return tiny_model_dir("llama")


@pytest.fixture(scope="session")
def smollm2() -> str:
    return smollm2_dir()
