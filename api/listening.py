"""How uvicorn serves the app: whose `X-Forwarded-For` is believed.

uvicorn believes the header from 127.0.0.1 unless told otherwise, so on a default bind any
local client could name any address, and a flood of bad tokens could spread itself over
made-up addresses past the failed-authentication limit. Here the header is believed only
from the proxies the operator names (`SHARDLINE_TRUSTED_PROXIES`); from anyone else the
connection's own address counts.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI

from shardline.service.config import Settings


def server_config(app: FastAPI, settings: Settings, **options: Any) -> uvicorn.Config:
    trusted = list(settings.trusted_proxies)
    return uvicorn.Config(
        app,
        log_level="warning",
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted,
        **options,
    )
