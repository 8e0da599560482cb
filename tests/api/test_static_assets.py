"""The docs and the status page come from this server with the right types and caching."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shardline.service.config import Settings
from shardline.service.migrate import upgrade_to_head
from tests.support.server import RunningServer, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder: Path = tmp_path_factory.mktemp("assets")
    url = f"sqlite:///{folder / 'shardline.db'}"
    upgrade_to_head(url)
    with run_server(Settings(database_url=url, state_dir=folder / "state")) as running:
        yield running


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/static/docs/swagger-ui-bundle.js", "javascript"),
        ("/static/docs/swagger-ui.css", "text/css"),
        ("/static/docs/favicon.png", "image/png"),
        ("/static/docs/redoc.standalone.js", "javascript"),
        ("/static/page/main.js", "javascript"),
        ("/static/page/app.css", "text/css"),
        ("/static/page/uplot.iife.min.js", "javascript"),
        ("/static/page/uplot.min.css", "text/css"),
    ],
)
def test_assets_have_their_type_and_are_cached(
    server: RunningServer, path: str, content_type: str
) -> None:
    response = httpx.get(server.url + path)
    assert response.status_code == 200
    assert content_type in response.headers["content-type"]
    assert response.headers["cache-control"] == "public, max-age=3600"
    assert response.headers["etag"]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/"])
def test_pages_are_revalidated_and_name_only_local_assets(server: RunningServer, path: str) -> None:
    response = httpx.get(server.url + path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    assert "http://" not in response.text and "https://" not in response.text


def test_status_page_forbids_other_origins(server: RunningServer) -> None:
    csp = httpx.get(server.url + "/").headers["content-security-policy"]
    assert "default-src 'self'" in csp


def test_head_of_the_page_is_200_and_sign_in_says_where_the_token_is(
    server: RunningServer,
) -> None:
    head = httpx.head(server.url + "/")
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/html")
    page = httpx.get(server.url + "/").text
    assert ".shardline/admin-token" in page and "shardline serve" in page


def test_missing_asset_is_404(server: RunningServer) -> None:
    assert httpx.get(server.url + "/static/page/nope.js").status_code == 404


def test_every_openapi_reference_resolves(server: RunningServer) -> None:
    document = httpx.get(server.url + "/openapi.json").json()
    refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(document)))
    assert "#/components/schemas/JobSpec" in refs or "#/components/schemas/ModelSpec" in refs
    for ref in refs:
        node = document
        for part in ref.removeprefix("#/").split("/"):
            assert part in node, f"{ref} does not resolve in /openapi.json"
            node = node[part]
