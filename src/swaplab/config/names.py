"""What a requested name denotes once the config is read: a model (by id or alias) or a peer's model.

The same rules as llama-swap's `RealModelName` and `ResolveBaseModel`: a local id or alias
wins; then a peer's fully qualified `PEER/MODEL`; then a bare model name that exactly one
peer lists. Profiles and selectors are resolved before these and are not names here.
"""

from __future__ import annotations

from swaplab.config.model import ModelConfig, PeerConfig


class Names:
    """The names of one config's models and peers' models."""

    def __init__(self, models: dict[str, ModelConfig], peers: dict[str, PeerConfig]):
        self.model_ids = set(models)
        self.aliases: dict[str, str] = {}
        for model in models.values():
            for alias in model.aliases:
                self.aliases.setdefault(alias, model.id)
        self.qualified: dict[str, list[str]] = {}
        """`PEER/MODEL` -> the peers that produce that name (two is an ambiguity)."""
        self.bare: dict[str, list[str]] = {}
        for peer in peers.values():
            for name in dict.fromkeys(peer.models):
                self.qualified.setdefault(f"{peer.id}/{name}", []).append(peer.id)
                self.bare.setdefault(name, []).append(f"{peer.id}/{name}")

    def local(self, name: str) -> str | None:
        """The model id `name` denotes (its id or an alias), or None."""
        if name in self.model_ids:
            return name
        return self.aliases.get(name)

    def peer(self, name: str) -> str | None:
        """The `PEER/MODEL` a name denotes: itself when fully qualified, or the one peer listing it bare."""
        if len(self.qualified.get(name, ())) == 1:
            return name
        owners = self.bare.get(name, [])
        return owners[0] if len(owners) == 1 else None

    def base(self, name: str) -> str | None:
        """A local model id, else a peer's `PEER/MODEL`, else None (llama-swap's ResolveBaseModel)."""
        return self.local(name) or self.peer(name)
