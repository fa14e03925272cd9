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
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from projectors.base import BIGINT_MAX
from schemas.errors import AgentLedgerError
from schemas.models import ModelUsagePart

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelInfo, TieredPrices
    from genai_prices.types import ModelPrice as GenaiModelPrice

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


@functools.cache
def _genai_version() -> str:
    """The installed genai-prices' version (looked up once: ~2 ms, and a projection is made
    for each read of a live state)."""
    from importlib.metadata import version

    return version("genai-prices")


class GenaiPrices:
    """Pydantic's maintained price database (`genai-prices`): historic prices by date, cache
    read and write rates, per-request tiers (long context). Only its bundled data is read (no
    network update), so its package version is its data version.

    ``genai_prices.calc_price`` costs ~0.2 ms a call, nearly all of it work that depends on the
    price alone: :class:`_GenaiMemo` does that work once per price and gives the same Decimal."""

    def __init__(self) -> None:
        self.version = f"genai-prices {_genai_version()}"
        self._memo: _GenaiMemo | None = None

    def price_call(
        self, provider: str, model: str, at: datetime, usage: Usage
    ) -> PricedCall | None:
        provider_id = _GENAI_PROVIDERS.get(provider.lower(), provider.lower())
        counts = (usage.input, usage.cached_input, usage.cache_write or 0, usage.output)
        memo = self._memo
        if memo is None or memo.stale():
            memo = self._memo = _GenaiMemo.of_current_data()
        total = memo.total(provider_id, model, at, counts)
        if total is _Ask.CALC:  # a case the memo leaves to genai-prices (which may raise)
            total = _calc_total(provider_id, model, at, counts)
        if isinstance(total, _Ask):
            return None  # genai-prices has no such model
        return PricedCall(Decimal(total), None, self.version)


def _calc_total(
    provider_id: str, model: str, at: datetime, counts: tuple[int, int, int, int]
) -> Decimal | _Ask:
    """``genai_prices.calc_price`` itself: the call's total price, or UNPRICED."""
    import genai_prices

    input_tokens, cache_read, cache_write, output_tokens = counts
    usage = genai_prices.Usage(
        input_tokens=input_tokens,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        output_tokens=output_tokens,
    )
    try:
        found = genai_prices.calc_price(
            usage, model_ref=model, provider_id=provider_id, genai_request_timestamp=at
        )
    except LookupError:
        return _Ask.UNPRICED
    return found.total_price


# The genai-prices release whose calc_price :class:`_GenaiMemo` reproduces (the one pinned in
# pyproject.toml); with any other every call goes to calc_price until the memo is checked
# against it (tests/unit/test_cost_metrics.py compares the two over the whole database).
_GENAI_CHECKED = "0.2.3"
# The usage keys GenaiPrices reports, in the order of its counts (all four always given).
_GENAI_KEYS = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


class _Ask(Enum):
    UNPRICED = "genai-prices has no such model"
    CALC = "ask calc_price itself"


class _GenaiMemo:
    """``calc_price`` of one genai-prices data snapshot, its per-price work done once.

    Per call ``calc_price`` finds the model (cached by genai-prices too), picks the price in
    effect at the call's time (:meth:`ModelInfo.get_prices`, still per call: a period may start
    on a date or cover hours of every day), then validates that price's units and decomposes
    the usage into the count each unit is charged for. The validation and the decomposition's
    shape depend on the price alone, so :class:`_GenaiRates` does them once per price, then
    charges each call's counts with genai-prices' own ``calc_unit_price``, unit by unit in its
    order: the same Decimal to the last digit and exponent. What the memo is not sure of (a
    price that fails validation, a usage genai-prices refuses, a model with a rule of its own,
    a genai-prices release not checked) it leaves to ``calc_price`` (:data:`_Ask.CALC`).
    """

    def __init__(self, snapshot: DataSnapshot | None, current: Callable[[], DataSnapshot]) -> None:
        self.snapshot = snapshot  # None: a release not checked, every call to calc_price
        self._current = current
        self._models: dict[tuple[str, str], ModelInfo | None] = {}
        self._rates: dict[int, tuple[GenaiModelPrice, _GenaiRates | None]] = {}

    @classmethod
    def of_current_data(cls) -> _GenaiMemo:
        from genai_prices import __version__, data_snapshot

        current = data_snapshot.get_snapshot
        return cls(current() if __version__ == _GENAI_CHECKED else None, current)

    def stale(self) -> bool:
        """Whether genai-prices' data changed (a custom snapshot was set in the process)."""
        return self.snapshot is not None and self._current() is not self.snapshot

    def total(
        self, provider_id: str, model: str, at: datetime, counts: tuple[int, int, int, int]
    ) -> Decimal | _Ask:
        """The call's total price as ``calc_price`` gives it, else what to do."""
        if self.snapshot is None:
            return _Ask.CALC
        key = (provider_id, model)
        if key in self._models:
            info = self._models[key]
        else:
            try:
                provider, info = self.snapshot.find_provider_model(model, None, provider_id, None)
            except LookupError:
                info = None
            except Exception:
                return _Ask.CALC
            if info is not None and provider.id == "groq" and info.id in _GROQ_WHISPER:
                return _Ask.CALC  # billed by audio seconds, a rule of calc_price's own
            if len(self._models) >= _MAX_MODELS:  # names from the entries: keep it bounded
                self._models.clear()
            self._models[key] = info
        if info is None:
            return _Ask.UNPRICED
        price = info.get_prices(at)
        held = self._rates.get(id(price))
        if held is None:
            held = self._rates[id(price)] = (price, _GenaiRates.of(price))  # keeps the id valid
        rates = held[1]
        total = rates.total(counts) if rates is not None else None
        return total if total is not None else _Ask.CALC


_GROQ_WHISPER = frozenset({"whisper-large-v3", "whisper-large-v3-turbo"})
_MAX_MODELS = 4096  # (provider, model) names remembered, found or not


@dataclass(slots=True)
class _GenaiRates:
    """One genai-prices price (a model's price for a period) made ready to charge counts.

    ``terms``: (usage key, price, per, charge of a count of 0) of each priced unit in
    ``calc_price``'s order (a price of one rate is charged inline as ``calc_unit_price`` does,
    ``price * Decimal(count) / per``, the same Decimal operations, once for a count of 0);
    ``leaves``: each priced unit's usage key (but ``requests``) with its priced descendants'
    keys, most specific first (the order of genai-prices' ``compute_leaf_values``);
    ``inferred``: by which of the four counts are positive, whether genai-prices infers 0 for
    every priced key not among them (else it refuses the usage).
    """

    terms: tuple[tuple[str, Decimal | TieredPrices, int, Decimal | None], ...]
    leaves: tuple[tuple[str, tuple[str, ...]], ...]
    tiered: bool
    unit_price: Callable[[Decimal | TieredPrices, int, int, int], Decimal]
    inferred: dict[tuple[bool, ...], bool]

    @classmethod
    def of(cls, price: GenaiModelPrice) -> _GenaiRates | None:
        """None when the price fails genai-prices' validation (calc_price then raises)."""
        from genai_prices.decompose import is_descendant_or_self
        from genai_prices.types import TieredPrices, _collect_resolved_model_prices, calc_unit_price
        from genai_prices.units import _get_registry
        from genai_prices.validation import validate_priced_units

        registry = _get_registry()
        try:
            resolved = _collect_resolved_model_prices(price, registry)
            validate_priced_units(tuple(unit for unit, _ in resolved), registry)
        except Exception:
            return None
        units = {unit.usage_key: unit for unit, _ in resolved if unit.usage_key != "requests"}
        order = sorted(units.values(), key=lambda unit: (-len(unit.dimensions), unit.usage_key))
        leaves = tuple(
            (
                unit.usage_key,
                tuple(
                    d.usage_key for d in order if d is not unit and is_descendant_or_self(unit, d)
                ),
            )
            for unit in order
        )
        return cls(
            terms=tuple(
                (
                    unit.usage_key,
                    value,
                    unit.per,
                    value * Decimal(0) / unit.per if isinstance(value, Decimal) else None,
                )
                for unit, value in resolved
            ),
            leaves=leaves,
            tiered=any(isinstance(value, TieredPrices) for _, value in resolved),
            unit_price=calc_unit_price,
            inferred={},
        )

    def total(self, counts: tuple[int, int, int, int]) -> Decimal | None:
        """``calc_price``'s total for these counts; None when genai-prices refuses them."""
        positive = (counts[0] > 0, counts[1] > 0, counts[2] > 0, counts[3] > 0)
        infers_zeros = self.inferred.get(positive)
        if infers_zeros is None:
            infers_zeros = self.inferred[positive] = self._infers_zeros(positive)
        if not infers_zeros:
            return None
        given = dict(zip(_GENAI_KEYS, counts, strict=True))
        leaf: dict[str, int] = {}
        for key, descendants in self.leaves:
            left = given.get(key, 0)
            for descendant in descendants:
                left -= leaf[descendant]
            if left < 0:
                return None  # more specific counts exceed their total
            leaf[key] = left
        tier_input = counts[0] if self.tiered else 0
        total = Decimal(0)
        for key, value, per, at_zero in self.terms:
            count = 1 if key == "requests" else leaf[key]
            if not isinstance(value, Decimal):  # tiered
                total += self.unit_price(value, count, tier_input, per)
            elif count == 0 and at_zero is not None:
                total += at_zero
            else:
                total += value * Decimal(count) / per
        return total

    def _infers_zeros(self, positive: tuple[bool, ...]) -> bool:
        """Whether genai-prices infers 0 for each priced key we do not give, when the given
        counts that are positive are ``positive``: what it infers depends on that alone, so a
        probe with those counts at 1 tells."""
        import genai_prices

        given = zip(_GENAI_KEYS, positive, strict=True)
        probe = genai_prices.Usage(**{key: int(p) for key, p in given})
        for key, _ in self.leaves:
            if key in _GENAI_KEYS:
                continue
            try:
                if getattr(probe, key) != 0:
                    return False
            except ValueError:
                return False
        return True


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
