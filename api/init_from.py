"""`model.init_from` at submit: the spec's model shape read from the folder's config.json.

The resolved spec is what is stored, so the scheduler (resources), every listing and the
workers see the model's real shape. Every problem is a 422 naming the field.
"""

from __future__ import annotations

from pydantic import ValidationError

from api.errors import ApiError, validation_failed
from service.config import Settings
from workers.contract.data_access import DataAccess, DataAccessDenied
from workers.contract.hf_config import InitFromError, resolve_init_from
from workers.contract.spec import JobSpec


def resolve_spec_init_from(spec: JobSpec, settings: Settings) -> JobSpec:
    """`spec` with its shape filled from `model.init_from` (unchanged without one).
    Call after check_data_path, which refuses a folder outside the data roots."""
    if spec.model.init_from is None:
        return spec
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    try:
        return resolve_init_from(spec, access)
    except InitFromError as err:
        raise ApiError(
            422, "validation_error", str(err), [{"field": err.field, "message": err.reason}]
        ) from None
    except DataAccessDenied as err:
        field = str(err).split(":", 1)[0]
        raise ApiError(
            422, "validation_error", str(err), [{"field": field, "message": str(err)}]
        ) from None
    except ValidationError as err:
        # The shape from config.json does not fit the layout (heads by tp, layers by pp).
        raise validation_failed(err.errors(), JobSpec) from None
    except OSError as err:
        raise ApiError(
            422,
            "validation_error",
            f"model.init_from: cannot read {spec.model.init_from} ({type(err).__name__})",
            [{"field": "model.init_from", "message": "cannot be read"}],
        ) from None
