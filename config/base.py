"""What every part of a pipeline's config shares: the error a bad config raises, the
frozen model, and the checks of names (topics, statistics, environment variables) and of
secrets written into the file."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from dpstream.operators.errors import DpStreamError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def topic_name(v: str) -> str:
    # Kafka's rules (kafka.common.internals.Topic.validate): the broker refuses any other.
    if not TOPIC.match(v) or v in (".", ".."):
        raise ValueError("must be a Kafka topic name ([A-Za-z0-9._-], 1-249 chars, not . or ..)")
    return v


def identifier(v: str) -> str:
    if not NAME.match(v):
        raise ValueError("must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 100 chars)")
    return v


class ConfigError(DpStreamError, ValueError):
    """The pipeline definition is invalid; the message names the field."""


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


def env_name(v: str | None) -> str | None:
    if v is not None and not ENV_NAME.match(v):
        raise ValueError("must be the name of an environment variable")
    return v


def no_inline_secret(data: object, names: tuple[str, ...], remedy: str) -> object:
    # Checked before anything else, and the message never repeats the value.
    if isinstance(data, dict):
        for name in names:
            if name in data:
                raise ValueError(f"{name}: secrets are never written in the config; use {remedy}")
    return data
