"""MoE Streaming Workbench: stream mixture-of-experts LLM experts from SSD, measure, replay."""

__version__ = "0.1.0"
