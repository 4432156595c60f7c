"""Compiled kernels minisgl builds itself (SGLang ships them as the separate sgl-kernel package)."""
