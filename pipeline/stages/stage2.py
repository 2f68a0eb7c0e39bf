"""Stage 2's bookkeeping, free of Kafka so the worker and ``dpstream replay`` share it.

Stage 2 (keyed by statistic) waits until every stage-1 partition has reported tick t, then
steps the statistic once; its releases are published at tick t's deadline
(``drivers.Stage2Driver``). It binds every statistic's noise to its identity (parameters,
run, key commitment, start tick) and refuses state it must not continue (docs/design.md
sections 4a and 4b), and adds the common fields to every release and ledger entry. Its
state is a ``Stage2State``, stored as its JSON."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.operators import accounting
from dpstream.operators.errors import DpStreamError
from dpstream.operators.noise import CachedNoise, NoiseSource, ScopedNoise
from dpstream.statistics.contract import Report, Statistic
from dpstream.statistics.identity import identity_parameters
from dpstream.statistics.registry import statistic_for
from dpstream.statistics.releases import Identity, Records

from .stage2_state import OFFLINE_RUN, Stage2State, StatisticIdentity, StatisticRun

log = logging.getLogger(__name__)


class StatisticChanged(DpStreamError):
    """Stage 2 found a statistic's state made under other parameters: continuing would
    re-draw noise it has released (the worker stops)."""


class Stage2:
    """Tick barrier across stage-1 partitions, then one step of the statistic per tick."""

    def __init__(
        self,
        cfg: PipelineConfig,
        noise: NoiseSource,
        partitions: int,
        runs: Mapping[str, StatisticRun] | None = None,
    ) -> None:
        """Stage 2 of ``cfg``'s statistics.

        Args:
            cfg: the pipeline.
            noise: the key's noise source.
            partitions: the stage-1 partitions (the events topic's).
            runs: each statistic's run as the ledger states it (the worker's); None:
                every statistic under ``OFFLINE_RUN`` (replay of a log without recorded
                runs, tests).
        """
        self._cfg = cfg
        # Keyed noise is deterministic per node, so remembering live nodes is safe.
        self._noise = CachedNoise(noise, maxsize=1 << 14)
        self._partitions = partitions
        self._statistics: dict[str, Statistic] = {
            s.name: statistic_for(s, cfg) for s in cfg.statistics
        }
        self._params = {s.name: identity_parameters(s, cfg) for s in cfg.statistics}
        self._fingerprints = {
            name: accounting.fingerprint(params) for name, params in self._params.items()
        }
        self._runs = {s.name: (runs or {}).get(s.name, OFFLINE_RUN) for s in cfg.statistics}
        charges = {c.statistic: c for c in cfg.privacy_statement().charges}
        self._records = Records(cfg, self._statistics, charges)

    def _check_identity(self, state: Stage2State, name: str) -> None:
        """Refuse a state this worker must not continue: another run's (its state lost
        and begun again, or a key changed: continuing would draw fresh noise for what
        was released), another key's, other parameters'. A state of a run the ledger
        started anew (charged again) is discarded."""
        identity = state.identity
        if identity is None:
            return
        run = self._runs[name]
        if identity.run_id in run.replaces:
            log.warning("statistic %s: run %s starts anew (charged again)", name, run.run_id)
            state.clear()
            return
        if identity.run_id != run.run_id:
            raise StatisticChanged(
                f"statistic {name}: its state belongs to run {identity.run_id}, the ledger's "
                f"run is {run.run_id}; continuing either would re-draw released noise: "
                f"restore the ledger, or start it anew with `dpstream ledger --charge-again "
                f"{name}` (charged again)"
            )
        if run.key_commitment is not None and identity.key_commitment != run.key_commitment:
            raise StatisticChanged(
                f"statistic {name}: its releases were drawn under another noise key; a "
                "changed key re-draws the noise of every released node: restore the key"
            )
        if identity.fingerprint != self._fingerprints[name]:
            changed = accounting.changed_fields(identity.parameters, self._params[name])
            raise StatisticChanged(
                f"statistic {name}: its state was made with other parameters "
                f"({', '.join(changed) or 'fingerprint'} changed); a changed statistic is a "
                "new statistic: give it a new name"
            )

    def _check_born(self, state: Stage2State, report: Report) -> None:
        """Refuse a stage-1 partition whose state began again: every user's contribution
        bound began again with it, inside trees that already hold their contributions."""
        if report.born is None:
            return
        born = state.born.setdefault(report.partition, report.born)
        if born != report.born:
            raise StatisticChanged(
                f"statistic {report.statistic}: stage-1 partition {report.partition} lost its "
                f"state (it began at tick {born}, now at tick {report.born}): each user's "
                "contribution bound began again inside the same trees; restore the stage-1 "
                "changelog, or start the statistic anew with `dpstream ledger --charge-again "
                f"{report.statistic}` (charged again)"
            )

    def _new_identity(self, name: str, tick: int) -> StatisticIdentity:
        """The statistic's identity at its first closed tick, which must be the tick its
        run first released at, if it has: a state that is gone and begun again at another
        tick would release the same data under fresh noise."""
        run = self._runs[name]
        if run.start_tick is not None and run.start_tick != tick:
            raise StatisticChanged(
                f"statistic {name}: run {run.run_id} released from tick {run.start_tick}, "
                f"but its state is gone (it would begin again at tick {tick} and release the "
                "same data under fresh noise): restore the stage-2 changelog, or start it "
                f"anew with `dpstream ledger --charge-again {name}` (charged again)"
            )
        return StatisticIdentity(
            self._fingerprints[name], self._params[name], tick, run.run_id, run.key_commitment
        )

    def _noise_of(self, identity: StatisticIdentity, name: str) -> NoiseSource:
        scope = (
            self._cfg.app_id,
            name,
            identity.fingerprint,
            identity.run_id,
            identity.start_tick,
        )
        return ScopedNoise(self._noise, scope)

    @staticmethod
    def new_state() -> Stage2State:
        return Stage2State()

    def on_report(self, state: Stage2State, report: Report) -> tuple[list[dict], list[dict]]:
        """Absorb one report; return (releases, ledger entries) for every tick it closes."""
        name = report.statistic
        self._check_identity(state, name)
        self._check_born(state, report)
        last = state.reported.get(report.partition)
        if last is not None and report.tick <= last:
            return [], []  # re-delivered report: already counted
        state.first.setdefault(report.partition, report.from_tick)
        state.reported[report.partition] = report.tick
        statistic = self._statistics[name]
        for tick, part in statistic.parts(report):
            at = min(max(tick, report.from_tick), report.tick)
            old = state.pending.get(at)
            state.pending[at] = part if old is None else statistic.merge(old, part)
        if len(state.reported) < self._partitions:
            return [], []
        origin = min(state.first.values())
        upto = min(state.reported.values())
        start = origin if state.last_closed is None else state.last_closed + 1
        releases, ledger = [], []
        for tick in range(start, upto + 1):
            if state.last_closed is None:
                identity = state.identity = self._new_identity(name, tick)
                ledger.append(
                    self._records.start(name, Identity(identity.fingerprint, identity.run_id, tick))
                )
            pending = state.pending.pop(tick, None)
            state.last_closed = tick
            if state.exhausted is not None:
                continue  # its budget is spent: nothing more is released, ever
            lifetime = statistic.lifetime_steps
            if lifetime is not None and tick - origin + 1 > lifetime:
                state.exhausted = tick
                release, entry = self._records.exhausted(name, tick)
                releases.append(release)
                ledger.append(entry)
                continue
            out, entries = self._advance(state, name, tick, pending)
            releases.extend(out)
            ledger.extend(entries)
        return releases, ledger

    def _advance(
        self, state: Stage2State, name: str, tick: int, pending: Any
    ) -> tuple[list[dict], list[dict]]:
        """One closed tick: (releases, ledger entries). ``pending`` is the tick's merged
        parts (None or empty when nothing came)."""
        assert state.identity is not None  # set when the first tick closed
        noise = self._noise_of(state.identity, name)
        step = self._statistics[name].step(state.statistic_state, pending or None, tick, noise)
        state.statistic_state = step.state
        return (
            [self._records.release(name, tick, fields) for fields in step.releases],
            [self._records.ledger(name, tick, fields) for fields in step.ledger],
        )
