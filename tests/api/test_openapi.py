"""The OpenAPI document: the committed docs/openapi.json is the one the code makes
(`dedupctl api openapi > docs/openapi.json` after a change to the API)."""

from __future__ import annotations

import json

from api.app import create_app
from settings import REPO_ROOT

COMMITTED = REPO_ROOT / "docs" / "openapi.json"


def test_the_committed_openapi_document_is_the_one_the_code_makes() -> None:
    made = create_app().openapi()
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == json.loads(json.dumps(made)), (
        "docs/openapi.json is stale: run `dedupctl api openapi > docs/openapi.json`"
    )


def test_every_v1_operation_documents_its_errors_and_the_bearer_scheme() -> None:
    doc = create_app().openapi()
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            codes = set(operation["responses"])
            assert "422" not in codes or (path, method) == ("/v1/notifications", "post"), (path, method)
            if path.startswith("/v1/"):
                assert operation["security"] == [{"bearer": []}]
                assert {"400", "401", "413", "503"} <= codes, (path, method, codes)
    assert {"200", "202", "400", "401", "403", "404", "409", "413", "422", "429", "503"} == set(
        doc["paths"]["/v1/notifications"]["post"]["responses"])
