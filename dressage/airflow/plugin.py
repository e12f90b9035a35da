"""The dressage Airflow plugin: each run's note, and its curves as the UI can open them.

    AIRFLOW__CORE__PLUGINS_FOLDER=plugins airflow standalone    # what `make airflow` does

- :class:`NoteListener`, a listener: when a dressage run ends (success or failure), the latest
  note its tasks offered (XCom key :data:`dressage.airflow.story.NOTE_KEY`) becomes the run's
  note, shown on the run's page. A task cannot write a note through Airflow 3's task API, and
  the scheduler, where the listener runs, can. A note a person wrote is never replaced.
- ``GET /dressage/curves?dag_id=...&run_id=...``, a FastAPI app mounted in the API server: the
  PNG of the run's curves, read from its staged artifacts (the URL that the ``stage`` task
  returned), for a signed-in user allowed to read the DAG's runs (the UI's session cookie is
  enough, so the note can show it as an image and link to it).

``plugins/dressage_ui.py`` imports :class:`DressagePlugin` so that Airflow finds it.
"""

from __future__ import annotations

import logging
from typing import Any, get_args

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

from dressage.airflow.story import NOTE_KEY

__all__ = ["DressagePlugin", "NoteListener", "curves_app", "curves_png", "note_for", "write_note"]

STAGE_TASK = "stage"
log = logging.getLogger(__name__)


def _xcom(session: Any, dag_id: str, run_id: str, key: str, task_id: str | None = None) -> Any:
    """The latest XCom value of ``key`` in a run (of ``task_id`` when given), or None."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    query = select(XComModel).where(
        XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == key
    )
    if task_id is not None:
        query = query.where(XComModel.task_id == task_id)
    row = session.scalars(query.order_by(XComModel.timestamp.desc()).limit(1)).first()
    return None if row is None else XComModel.deserialize_value(row)


def note_for(session: Any, dag_id: str, run_id: str) -> str | None:
    """The note a run's tasks offered last, or None."""
    value = _xcom(session, dag_id, run_id, NOTE_KEY)
    return str(value) if value else None


def write_note(dag_run: Any, session: Any) -> bool:
    """Set ``dag_run``'s note from its tasks' offer, unless a person wrote one; True if set."""
    note = note_for(session, dag_run.dag_id, dag_run.run_id)
    current = dag_run.dag_run_note
    if note is None or (current is not None and current.user_id is not None):
        return False
    if current is not None:
        current.content = note
    else:
        dag_run.note = (note, None)
    session.flush()
    return True


def _on_end(dag_run: Any) -> None:
    from sqlalchemy.orm import object_session

    if not str(dag_run.dag_id).startswith("dressage_"):
        return
    session = object_session(dag_run)
    if session is not None:
        write_note(dag_run, session)
        return
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as own:
        attached = own.get(DagRun, dag_run.id)
        if attached is not None:
            write_note(attached, own)


class NoteListener:
    """Writes a dressage run's note when the run ends (see the module docstring)."""

    @hookimpl
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        _on_end(dag_run)

    @hookimpl
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        _on_end(dag_run)


def curves_png(session: Any, dag_id: str, run_id: str) -> bytes:
    """The run's ``curves.png`` from its staged artifacts; LookupError naming what is missing."""
    from dressage.staging import ArtifactError, open_artifact

    staged = _xcom(session, dag_id, run_id, "return_value", STAGE_TASK)
    if not isinstance(staged, dict) or not staged.get("url"):
        raise LookupError(f"run {run_id!r} of {dag_id!r} has no staged artifacts (yet)")
    try:
        return open_artifact(str(staged["url"])).read_blob("curves.png")
    except (ArtifactError, KeyError, OSError) as exc:
        raise LookupError(f"no curves at {staged['url']}: {exc}") from None


def curves_app() -> Any:
    """The FastAPI app serving ``/curves`` (mounted under ``/dressage``)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.common.db.common import SessionDep
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends, FastAPI, HTTPException, Response

    session_dep = get_args(SessionDep)[1]  # its Depends: the annotation is a string here
    app = FastAPI(title="dressage reports", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/curves", dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
    def curves(dag_id: str, run_id: str, session: Any = session_dep) -> Response:
        try:
            png = curves_png(session, dag_id, run_id)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    return app


class DressagePlugin(AirflowPlugin):
    name = "dressage"
    listeners = [NoteListener()]
    fastapi_apps = [{"app": curves_app(), "url_prefix": "/dressage", "name": "dressage reports"}]
