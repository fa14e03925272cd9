"""The naive baseline of ``agentledger bench``: what a user writes first.

A plain faust agent that, for every entry, opens a transaction, loads each projection's state
for the run, folds the entry, writes the state back and commits: the same pure projections as
the product, none of its batching. Run with ``python -m streams.naive`` (the bench does, with the
deployment's environment); it counts what it applied in ``al_naive_progress``.
"""

from __future__ import annotations

from typing import Any

import faust
import psycopg
from psycopg.types.json import Jsonb

from infra.settings import Settings, load_settings
from projectors.registry import all_projections
from schemas.codec import LedgerCodec
from schemas.topics import ledger_topic

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS al_naive_state (projection text, run_id text, state jsonb, "
    "PRIMARY KEY (projection, run_id)); "
    "CREATE TABLE IF NOT EXISTS al_naive_progress (id int PRIMARY KEY, applied bigint); "
    "INSERT INTO al_naive_progress VALUES (1, 0) ON CONFLICT DO NOTHING"
)


def create_schema(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(SCHEMA)


def applied(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT applied FROM al_naive_progress WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def create_app(settings: Settings) -> faust.App:
    topics = [ledger_topic(settings.topic_prefix, f) for f in settings.fleet_ids]
    app = faust.App(
        f"{settings.topic_prefix}-naive",
        broker=f"kafka://{settings.kafka_address}",
        store="memory://",
        value_serializer="raw",
        key_serializer="raw",
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        datadir=str(settings.state_dir / "faust-naive"),
    )
    codec = LedgerCodec()
    projections = all_projections(settings)

    @app.agent(app.topic(*topics, value_type=bytes))
    async def apply(stream: Any) -> None:
        create_schema(settings.pg_address)
        conn = await psycopg.AsyncConnection.connect(settings.pg_address)
        async for value in stream:
            entry = codec.decode(value)
            async with conn.transaction():
                for p in projections:
                    cur = await conn.execute(
                        "SELECT state FROM al_naive_state WHERE projection = %s AND run_id = %s "
                        "FOR UPDATE",
                        (p.name, entry.run_id),
                    )
                    row = await cur.fetchone()
                    state = p.from_doc(row[0]) if row else p.initial(entry)
                    if p.accepts(entry):
                        state = p.finish(p.fold(state, entry))
                    await conn.execute(
                        "INSERT INTO al_naive_state VALUES (%s, %s, %s) ON CONFLICT "
                        "(projection, run_id) DO UPDATE SET state = EXCLUDED.state",
                        (p.name, entry.run_id, Jsonb(p.to_doc(state))),
                    )
                await conn.execute("UPDATE al_naive_progress SET applied = applied + 1")

    return app


def main() -> None:
    app = create_app(load_settings())
    faust.Worker(app, loglevel="warning").execute_from_commandline()


if __name__ == "__main__":
    main()
