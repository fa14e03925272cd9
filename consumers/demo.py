"""``agentledger demo``: bring the stack up and show data flowing through it end to end."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console

from infra import local
from infra.roundtrip import kafka_roundtrip, postgres_roundtrip, redis_roundtrip
from infra.settings import Settings


def run_demo(settings: Settings, console: Console) -> None:
    local.up(settings, console)
    started = time.perf_counter()
    topic = f"{settings.topic_prefix}.demo.{int(time.time() * 1000)}"
    sent = asyncio.run(kafka_roundtrip(settings, topic, 1000))
    console.print(f"kafka: {sent} records produced to {topic} and read back in order")
    console.print(f"postgres: {postgres_roundtrip(settings)}")
    console.print(f"redis: {redis_roundtrip(settings)}")
    console.print(f"demo finished in {time.perf_counter() - started:.1f}s")
