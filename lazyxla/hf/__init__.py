"""hf"""
from .generation import generate  # noqa: F401
