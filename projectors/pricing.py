"""Model-call pricing: a versioned usage normalizer and a versioned price table.

**Normalized usage** (``NORMALIZER_VERSION`` 2), the convention of ``ModelUsagePart``'s fields:

* ``input``: every prompt token the provider processed, cache reads and cache writes included;
* ``cached_input``: the prompt tokens read from the provider's cache (a part of ``input``);
* ``output``: every generated token, reasoning ("thinking") included;
* ``reasoning``: the generated tokens spent on reasoning (a part of ``output``);
* ``cache_write``: the prompt tokens written to the cache (a part of ``input``), when reported.

A call whose entry marks input or output tokens unknown (``unknown_fields``, schema v3) and whose
raw usage does not give them has unknown usage: :func:`normalize_usage` returns None, never zeros.

Each provider's raw usage is read in its own shape:

* ``anthropic``: ``input_tokens`` excludes cache reads and writes, so input = input_tokens +
  cache_read_input_tokens + cache_creation_input_tokens and cached = cache_read_input_tokens.
  Thinking is billed inside ``output_tokens`` and not reported apart: reasoning = 0.
  cache_write = cache_creation_input_tokens.
* ``openai``: Chat Completions (``prompt_tokens``/``completion_tokens``) or Responses
  (``input_tokens``/``output_tokens``), each with ``*_details.cached_tokens`` and
  ``*_details.reasoning_tokens``. Prompt includes cached and completion includes reasoning, so the
  counts map one to one. Codex's flattened ``token_count`` shape (``cached_input_tokens``,
  ``reasoning_output_tokens`` beside ``input_tokens``/``output_tokens``) is read the same way.
* ``openrouter``, ``portkey`` (OpenAI-compatible gateways): as ``openai``, except that for Google
  models (``google/...``, ``gemini...``) ``completion_tokens`` excludes the reasoning tokens they
  report apart, so output = completion + reasoning (:data:`REASONING_APART`).
* ``google``: ``promptTokenCount`` includes ``cachedContentTokenCount``; ``candidatesTokenCount``
  excludes ``thoughtsTokenCount``, so output = candidates + thoughts and reasoning = thoughts;
  ``toolUsePromptTokenCount`` is prompt input too. camelCase (REST) or snake_case (SDK) keys.

Raw usage wrapped in ``usage``/``usageMetadata`` is unwrapped. Any other provider, or raw usage not
of its provider's shape (a required count missing, a count not a non-negative integer, cached above
input, reasoning above output), falls back to the entry's own fields: normalizer ``entry-fields``.

**Charging**, per million tokens at the price in effect on the call's UTC date: uncached input
(input - cached) at ``input``; cached input at ``cached_input`` (``input`` when the table gives
none); non-reasoning output (output - reasoning) at ``output``; reasoning at ``reasoning``
(``output`` when none); cache writes at ``cache_write`` (as uncached input when the table gives
none). Tiered (long-context) prices are not modelled. Amounts are exact ``Decimal`` USD, never
floats.

**Price table** (JSON, ``projectors/data/prices.v1.json`` ships)::

    {"version": "2026-11-01", "currency": "USD", "unit": "per_million_tokens",
     "models": {"<provider>/<model>" | "<model>": [
         {"effective_from": "YYYY-MM-DD", "input": 3.0, "cached_input": 0.3,
          "output": 15.0, "reasoning": 15.0}, ...]}}

``cached_input`` and ``reasoning`` are optional. A period applies from 00:00 UTC of its
``effective_from`` until the next period of the same model. ``<provider>/<model>`` is looked up
first, then the bare model name. Prices are read as exact decimals.
"""

from __future__ import annotations

import functools
import json
import os
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from projectors.base import BIGINT_MAX
from schemas.errors import AgentLedgerError
from schemas.models import ModelUsagePart

NORMALIZER_VERSION = 2
ENTRY_FIELDS = "entry-fields"
SHIPPED_PRICES = "data/prices.v1.json"
_MILLION = Decimal(1_000_000)
_ZERO = Decimal(0)


class PriceTableError(AgentLedgerError):
    """A price table is not valid; fix the file (``projectors/data/prices.v1.json`` shows how)."""


def usd_text(value: Decimal) -> str:
    """An exact USD amount as plain decimal text, without exponent or trailing zeros."""
    return format(value.normalize(), "f") if value else "0"


@dataclass(frozen=True, slots=True)
class Usage:
    """Normalized token counts of one call and the normalizer that produced them."""

    input: int
    cached_input: int
    output: int
    reasoning: int
    normalizer: str
    cache_write: int | None = None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


PerMillion = Annotated[Decimal, Field(ge=0, allow_inf_nan=False)]


class ModelPrice(_Frozen):
    """USD per million tokens of one model from ``effective_from`` on."""

    effective_from: date
    input: PerMillion
    cached_input: PerMillion | None = None
    output: PerMillion
    reasoning: PerMillion | None = None
    cache_write: PerMillion | None = None

    def cost(self, usage: Usage) -> Decimal:
        """The exact USD cost of ``usage`` at these prices."""
        cached_rate = self.input if self.cached_input is None else self.cached_input
        reasoning_rate = self.output if self.reasoning is None else self.reasoning
        # cache writes at their own rate when the table has one, else inside uncached input
        written = (usage.cache_write or 0) if self.cache_write is not None else 0
        per_million = (
            (usage.input - usage.cached_input - written) * self.input
            + written * (self.cache_write or _ZERO)
            + usage.cached_input * cached_rate
            + (usage.output - usage.reasoning) * self.output
            + usage.reasoning * reasoning_rate
        )
        return per_million / _MILLION


class _PriceTableDoc(_Frozen):
    version: Annotated[str, Field(min_length=1)]
    currency: Literal["USD"]
    unit: Literal["per_million_tokens"] = "per_million_tokens"
    models: dict[str, Annotated[tuple[ModelPrice, ...], Field(min_length=1)]]

    @field_validator("models")
    @classmethod
    def _one_price_per_day(
        cls, value: dict[str, tuple[ModelPrice, ...]]
    ) -> dict[str, tuple[ModelPrice, ...]]:
        for key, periods in value.items():
            starts = [p.effective_from for p in periods]
            if len(set(starts)) != len(starts):
                raise ValueError(f"{key}: two prices with the same effective_from")
        return value


class PriceTable:
    """A parsed price table: the price of a model at a time. Parse once, look up per call."""

    def __init__(self, version: str, models: Mapping[str, tuple[ModelPrice, ...]]) -> None:
        self.version = version
        self._periods = {
            key: tuple(sorted(periods, key=lambda p: p.effective_from))
            for key, periods in models.items()
        }
        self._starts = {
            key: [p.effective_from for p in periods] for key, periods in self._periods.items()
        }

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "price table") -> PriceTable:
        """Parse a price table document; raises PriceTableError naming the bad field."""
        try:
            data = json.loads(text, parse_float=Decimal)
        except ValueError as exc:
            raise PriceTableError(f"{source}: not a JSON document: {exc}") from None
        try:
            doc = _PriceTableDoc.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(item) for item in first["loc"]) or "document"
            raise PriceTableError(f"{source}: {where}: {first['msg']}") from None
        return cls(doc.version, doc.models)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PriceTable:
        """A user's price table file, replacing the shipped one."""
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise PriceTableError(f"cannot read price table {file}: {exc.strerror}") from None
        return cls.from_json(text, str(file))

    @classmethod
    def shipped(cls) -> PriceTable:
        """The table shipped with the package (parsed once per process)."""
        return _shipped()

    @property
    def models(self) -> list[str]:
        """The keys priced, ``provider/model`` or bare model names."""
        return list(self._periods)

    def price(self, provider: str, model: str, at: datetime) -> ModelPrice | None:
        """The price in effect at ``at``; None when the model is not priced then."""
        key = f"{provider}/{model}"
        starts = self._starts.get(key)
        if starts is None:
            key, starts = model, self._starts.get(model)
            if starts is None:
                return None
        i = bisect_right(starts, at.astimezone(UTC).date())
        return self._periods[key][i - 1] if i else None

    def price_call(
        self, provider: str, model: str, at: datetime, usage: Usage
    ) -> PricedCall | None:
        price = self.price(provider, model, at)
        if price is None:
            return None
        return PricedCall(price.cost(usage), price.effective_from, f"table {self.version}")


@dataclass(frozen=True, slots=True)
class PricedCall:
    """A call's exact cost, the day its price took effect (when the source says) and the source."""

    cost: Decimal
    effective_from: date | None
    source: str


class PriceSource(Protocol):
    """Where call prices come from; ``version`` is recorded with every build that used it, so a
    rebuild with the same source reprices exactly."""

    version: str

    def price_call(
        self, provider: str, model: str, at: datetime, usage: Usage
    ) -> PricedCall | None:
        """The call's cost at the price in effect at ``at``; None: unpriced (never $0)."""


# Our provider names where genai-prices names a provider otherwise.
_GENAI_PROVIDERS = {"meta": "groq"}


class GenaiPrices:
    """Pydantic's maintained price database (`genai-prices`): historic prices by date, cache
    read and write rates, per-request tiers (long context). Only its bundled data is read (no
    network update), so its package version is its data version."""

    def __init__(self) -> None:
        from importlib.metadata import version

        self.version = f"genai-prices {version('genai-prices')}"

    def price_call(
        self, provider: str, model: str, at: datetime, usage: Usage
    ) -> PricedCall | None:
        import genai_prices

        counts = genai_prices.Usage(
            input_tokens=usage.input,
            cache_read_tokens=usage.cached_input,
            cache_write_tokens=usage.cache_write or 0,
            output_tokens=usage.output,
        )
        try:
            found = genai_prices.calc_price(
                counts,
                model_ref=model,
                provider_id=_GENAI_PROVIDERS.get(provider.lower(), provider.lower()),
                genai_request_timestamp=at,
            )
        except LookupError:
            return None
        return PricedCall(Decimal(found.total_price), None, self.version)


class LayeredPrices:
    """Our own table (when given) over the maintained database: a model the table prices is
    priced by it, any other by genai-prices."""

    def __init__(self, override: PriceTable | None = None, base: GenaiPrices | None = None) -> None:
        self.override = override
        self.base = base or GenaiPrices()
        self.version = self.base.version + (
            f" + table {override.version}" if override is not None else ""
        )

    def price_call(
        self, provider: str, model: str, at: datetime, usage: Usage
    ) -> PricedCall | None:
        if self.override is not None:
            found = self.override.price_call(provider, model, at, usage)
            if found is not None:
                return found
        return self.base.price_call(provider, model, at, usage)


@functools.cache
def _shipped() -> PriceTable:
    text = resources.files("projectors").joinpath(SHIPPED_PRICES).read_text(encoding="utf-8")
    return PriceTable.from_json(text, f"projectors/{SHIPPED_PRICES}")


class _ShapeError(Exception):
    """Raw usage is not of the shape a normalizer reads."""


def normalize_usage(part: ModelUsagePart) -> Usage | None:
    """The call's usage in the normalized convention, read from its provider's raw usage; None
    when its token counts are unknown (and the raw usage does not give them)."""
    usage = normalize_raw(part.provider, part.model, part.raw_usage_json)
    if usage is not None:
        return usage
    if not (part.known("input_tokens") and part.known("output_tokens")):
        return None
    return Usage(
        part.input_tokens,
        part.cached_input_tokens if part.known("cached_input_tokens") else 0,
        part.output_tokens,
        part.reasoning_tokens if part.known("reasoning_tokens") else 0,
        ENTRY_FIELDS,
        part.cache_write_input_tokens,
    )


def normalize_raw(provider: str, model: str, raw_usage_json: str) -> Usage | None:
    """A provider's raw usage read in its own convention (importers fill an entry's normalized
    fields with it); None when the provider has no normalizer or the raw usage is not of its
    shape."""
    name = provider.lower()
    normalizer = _NORMALIZERS.get(name)
    if normalizer is None:
        return None
    try:
        raw = _raw(raw_usage_json)
        usage = (
            _openai(raw, reasoning_apart=True)
            if name in REASONING_APART and _is_google(model)
            else normalizer(raw)
        )
    except _ShapeError:
        return None
    fits = usage.input <= BIGINT_MAX and usage.output <= BIGINT_MAX  # a stored count
    if fits and usage.cached_input <= usage.input and usage.reasoning <= usage.output:
        return usage
    return None


# OpenAI-compatible gateways that report a Google model's reasoning tokens apart from (not inside)
# its completion tokens.
REASONING_APART = frozenset({"openrouter", "portkey"})


def _is_google(model: str) -> bool:
    name = model.lower()
    return name.startswith(("google/", "gemini")) or "/gemini" in name


def _raw(text: str) -> Mapping[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise _ShapeError("not JSON") from None
    if not isinstance(value, dict):
        raise _ShapeError("not an object")
    for wrapper in ("usage", "usageMetadata", "usage_metadata"):
        inner = value.get(wrapper)
        if isinstance(inner, dict):
            return inner
    return value


def _count(raw: Mapping[str, Any], key: str, required: bool = False) -> int:
    value = raw.get(key)
    if value is None and not required:
        return 0
    if type(value) is not int or value < 0:
        raise _ShapeError(key)
    return value


def _details(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _ShapeError(key)
    return value


def _anthropic(raw: Mapping[str, Any]) -> Usage:
    uncached = _count(raw, "input_tokens", required=True)
    read = _count(raw, "cache_read_input_tokens")
    written = _count(raw, "cache_creation_input_tokens")
    output = _count(raw, "output_tokens", required=True)
    return Usage(uncached + read + written, read, output, 0, "anthropic", written)


def _openai(raw: Mapping[str, Any], reasoning_apart: bool = False) -> Usage:
    prompt, completion = (
        ("prompt_tokens", "completion_tokens")  # Chat Completions
        if "prompt_tokens" in raw
        else ("input_tokens", "output_tokens")  # Responses
    )
    if "cached_input_tokens" in raw or "reasoning_output_tokens" in raw:  # Codex's token_count
        cached = _count(raw, "cached_input_tokens")
        reasoning = _count(raw, "reasoning_output_tokens")
    else:
        cached = _count(_details(raw, f"{prompt}_details"), "cached_tokens")
        reasoning = _count(_details(raw, f"{completion}_details"), "reasoning_tokens")
    total_in = _count(raw, prompt, required=True)
    output = _count(raw, completion, required=True) + (reasoning if reasoning_apart else 0)
    return Usage(total_in, cached, output, reasoning, "openai")


_GOOGLE_CAMEL = (
    "promptTokenCount",
    "toolUsePromptTokenCount",
    "cachedContentTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
)
_GOOGLE_SNAKE = (
    "prompt_token_count",
    "tool_use_prompt_token_count",
    "cached_content_token_count",
    "candidates_token_count",
    "thoughts_token_count",
)


def _google(raw: Mapping[str, Any]) -> Usage:
    prompt, tool_use, cached, candidates, thoughts = (
        _GOOGLE_SNAKE if "prompt_token_count" in raw else _GOOGLE_CAMEL
    )
    total_in = _count(raw, prompt, required=True) + _count(raw, tool_use)
    reasoning = _count(raw, thoughts)
    output = _count(raw, candidates) + reasoning
    return Usage(total_in, _count(raw, cached), output, reasoning, "google")


_NORMALIZERS: dict[str, Callable[[Mapping[str, Any]], Usage]] = {
    "anthropic": _anthropic,
    "openai": _openai,
    "google": _google,
    "openrouter": _openai,
    "portkey": _openai,
}
