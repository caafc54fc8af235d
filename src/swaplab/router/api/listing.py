"""`GET /v1/models`: the records of local models, their aliases, peers' models, selectors and pins.

Each record is llama-swap's: `status` is `{"value": "loaded" | "unloaded"}` (loaded: any
state but stopped; a selector: a target ready, starting or waking), to which swaplab adds
`"state"`, the model's own state (`sleeping`, `waking`, ...; a peer's model: `available`
or `unavailable`); `capabilities` are rendered as llama-swap renders them
(`render_capabilities`), `meta` is `{"llamaswap": {...metadata, "type": ...}, "n_ctx": N}`.
swaplab's `name` falls back to the id where llama-swap omits an empty one, but for a selector
(llama-swap's page shows a selector's name beside its id).
Pure functions over the config and what the caller reads of the fleet and the peers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swaplab.config.model import Capabilities, Config
from swaplab.fleet import State
from swaplab.router.path.targets import LocalTarget, resolve

NO_CAPABILITIES = Capabilities()
# Fields the capabilities renderer owns: a model with capabilities drops these metadata keys.
CAPPED_METADATA = frozenset({"architecture", "capabilities", "supported_parameters", "context_length"})


def render_capabilities(capabilities: Capabilities) -> dict[str, Any]:
    """llama-swap's `renderCapabilities`: the record fields a model's `capabilities` add (none when empty)."""
    fields: dict[str, Any] = {}
    if not capabilities:
        return fields
    inputs, outputs = list(capabilities.input), list(capabilities.output)
    if inputs or outputs:
        architecture: dict[str, Any] = {}
        if inputs:
            architecture["input_modalities"] = inputs
        if outputs:
            architecture["output_modalities"] = outputs
        if inputs and outputs:
            architecture["modality"] = "+".join(inputs) + "->" + "+".join(outputs)
        fields["architecture"] = architecture
    if inputs or outputs or capabilities.tools or capabilities.reranker:
        flags: dict[str, bool] = {}
        if "image" in inputs:
            flags["vision"] = True
        if inputs and outputs:
            pairs = {
                "audio_transcriptions": ("audio", "text"),
                "audio_speech": ("text", "audio"),
                "image_generation": ("text", "image"),
                "image_to_image": ("image", "image"),
            }
            for flag, (given, produced) in pairs.items():
                if given in inputs and produced in outputs:
                    flags[flag] = True
        if capabilities.tools:
            flags["function_calling"] = True
        if capabilities.reranker:
            flags["reranker"] = True
        if flags:  # llama-swap omits an empty map
            fields["capabilities"] = flags
    if capabilities.tools:
        fields["supported_parameters"] = ["tools", "tool_choice"]
    if capabilities.context > 0:
        fields["context_length"] = capabilities.context
    return fields


def status_of(state: str, loaded: bool | None = None) -> dict[str, str]:
    """llama-swap's `{"value": "loaded" | "unloaded"}`, and swaplab's `state` beside it."""
    if loaded is None:
        loaded = state not in (str(State.STOPPED), "")
    return {"value": "loaded" if loaded else "unloaded", "state": state}


def record(
    record_id: str,
    *,
    created: int,
    status: dict[str, str],
    name: str = "",
    description: str = "",
    metadata: dict[str, Any] | None = None,
    capabilities: Capabilities = NO_CAPABILITIES,
    internal: dict[str, Any],
    owned_by: str = "swaplab",
    name_fallback: bool = True,
) -> dict[str, Any]:
    """One `/v1/models` record: swaplab's fields, then llama-swap's capabilities and `meta`.

    An empty `name` is the id, unless `name_fallback` is off: then, as llama-swap, there is none.
    """
    entry: dict[str, Any] = {
        "id": record_id,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "name": name.strip() or record_id,
        "description": description.strip(),
        "status": status,
    }
    if not name.strip() and not name_fallback:
        del entry["name"]
    rendered = render_capabilities(capabilities)
    entry.update(rendered)
    metadata = metadata or {}
    if capabilities:
        metadata = {key: value for key, value in metadata.items() if key not in CAPPED_METADATA}
    # Internal keys after the user's: a user `type` or `aliases` is overwritten, as in llama-swap.
    llamaswap = {**metadata, **internal}
    meta: dict[str, Any] = {}
    if llamaswap:
        meta["llamaswap"] = llamaswap
    if "context_length" in rendered:
        meta["n_ctx"] = rendered["context_length"]
    if meta:
        entry["meta"] = meta
    return entry


def model_records(
    config: Config,
    state_of: Callable[[str], State],
    created: int,
    active_pins: dict[str, str] | None,
    aliases: bool | None = None,
) -> list[dict[str, Any]]:
    """Local models (not `unlisted`), each followed by its aliases with `includeAliasesInList`
    (or as `aliases` says: OpenAI's retrieve finds an alias's record either way); then selectors
    (not `unlisted`) and the active profile's pins no other name takes.

    Peers' models are the caller's (their status is the peers' health).
    """
    if aliases is None:
        aliases = config.include_aliases_in_list
    data = []
    for model in config.models.values():
        if model.unlisted:
            continue
        status = status_of(str(state_of(model.id)))
        internal: dict[str, Any] = {"type": "model"}
        if model.aliases:
            internal["aliases"] = list(model.aliases)
        fields = {"created": created, "status": status, "name": model.name, "description": model.description,
                  "metadata": model.metadata, "capabilities": model.capabilities}
        entry = record(model.id, internal=internal, **fields)
        data.append(entry)
        if aliases:
            for alias in model.aliases:
                if alias.strip():
                    aliased = record(alias, internal={"type": "alias", "modelID": model.id}, **fields)
                    aliased["alias_of"] = model.id
                    data.append(aliased)
    for selector in config.selectors.values():
        if selector.unlisted:
            continue
        internal = {"type": "selector", "strategy": selector.strategy, "targets": list(selector.targets)}
        if selector.strategy == "spillover":
            internal["spillover"] = selector.spillover
        data.append(record(
            selector.id, created=created, status=_selector_status(config, selector.targets, selector.strategy, state_of),
            name=selector.name, description=selector.description, metadata=selector.metadata, internal=internal,
            name_fallback=False,  # llama-swap's page shows a selector's `name` beside its id ("pool - pool")
        ))
    if active_pins:
        taken = _names(config)
        for pin, target in active_pins.items():
            if target and pin not in taken:
                data.append(record(pin, created=created, status=status_of(str(State.STOPPED)), internal={"type": "profile"}))
    return data


def peer_record(peer_id: str, model: str, created: int) -> dict[str, Any]:
    """A peer's model as llama-swap lists it; the caller adds its availability."""
    return record(
        f"{peer_id}/{model}", created=created, status=status_of(""), name=f"{peer_id}: {model}", owned_by=peer_id,
        internal={"type": "peer", "peerID": peer_id},
    )


def _selector_status(
    config: Config, targets: tuple[str, ...], strategy: str, state_of: Callable[[str], State]
) -> dict[str, str]:
    """Loaded, with its state, when a local target is ready, starting or waking (`pin`: only the first
    target), as llama-swap reads a selector; else unloaded and stopped."""
    for target in targets:
        resolved = resolve(config, target)
        if isinstance(resolved, LocalTarget):
            state = state_of(resolved.model_id)
            if state.serving:
                return status_of(str(state), loaded=True)
        if strategy == "pin":
            break
    return status_of(str(State.STOPPED), loaded=False)


def _names(config: Config) -> set[str]:
    """Every name that routes without a profile: ids, aliases, peers' models, selectors."""
    names = set(config.selectors)
    for model in config.models.values():
        names.add(model.id)
        names.update(model.aliases)
    for peer in config.peers.values():
        for model in peer.models:
            names.add(f"{peer.id}/{model}")
            if resolve(config, model) is not None:  # the bare name, when one peer alone lists it
                names.add(model)
    return names
