"""dpstream's pytest plugin as a user meets it: the README's example test, verbatim in
spirit -- a worker on a zero-noise config, events in, exact releases out."""

from __future__ import annotations

import pytest

from tests.integration.scenarios import zero_noise_count_of_clicks

pytestmark = pytest.mark.integration


def test_zero_noise_count_of_clicks(dpstream_pipeline):
    zero_noise_count_of_clicks(dpstream_pipeline)
