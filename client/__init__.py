"""dpstream's downstream client: a pipeline's releases, ledger entries and dead letters as
typed records, validated against the JSON Schemas published in docs/schemas/.

    from dpstream.client import releases
    from dpstream.config.schema import load_config

    cfg = load_config("pipeline.yaml")
    for r in releases("page_views", "localhost:9092", cfg, follow=True):
        print(r.tick, r.value, r.interval)

``to_dataframe`` needs the optional extra ``dpstream[pandas]``. docs/client.md says more.
"""

from .frames import to_dataframe
from .reader import dead_letters, ledger, releases
from .records import (
    DeadLetter,
    LedgerEntry,
    Position,
    RecordError,
    Release,
    UnknownSchemaVersion,
)

__all__ = [
    "DeadLetter",
    "LedgerEntry",
    "Position",
    "RecordError",
    "Release",
    "UnknownSchemaVersion",
    "dead_letters",
    "ledger",
    "releases",
    "to_dataframe",
]
