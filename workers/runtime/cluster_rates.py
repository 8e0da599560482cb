"""The cluster's calibrated rates where supervisors can read them: the control plane keeps
them in its database and publishes each device class's here, in Ray's key-value store, so
an elastic re-plan (workers/runtime/placement/elastic.py) plans with what `parallel: auto`
planned with at submit."""

from __future__ import annotations

import json
import logging

from ray.experimental import internal_kv

from shardline.workers.contract.planner import default_rates, rates_kind
from shardline.workers.contract.rates import Rates
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.names import NAMESPACE

log = logging.getLogger(__name__)


def _key(kind: str) -> str:
    return f"rates/{kind}"


def publish(kind: str, rates: Rates) -> None:
    internal_kv._internal_kv_put(
        _key(kind), json.dumps(rates.to_json()).encode(), overwrite=True, namespace=NAMESPACE
    )


def planning_rates(spec: JobSpec) -> Rates:
    """The calibrated rates of `spec`'s device class, else the defaults (and outside a
    Ray cluster: tests and tools re-plan too)."""
    if not internal_kv._internal_kv_initialized():
        return default_rates(spec)
    try:
        raw = internal_kv._internal_kv_get(_key(rates_kind(spec)), namespace=NAMESPACE)
        if raw:
            return Rates.from_json(json.loads(raw))
    except Exception as err:  # a re-plan must not fail for want of calibration
        log.warning("reading the cluster's calibrated rates failed (%s): defaults", err)
    return default_rates(spec)
