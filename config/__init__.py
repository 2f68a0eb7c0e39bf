"""Pipeline definitions (YAML) and their validation."""

from .schema import ConfigError, PipelineConfig, StatisticConfig, load_config, parse_config

__all__ = ["ConfigError", "PipelineConfig", "StatisticConfig", "load_config", "parse_config"]
