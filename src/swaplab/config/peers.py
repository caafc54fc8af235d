"""The `peers:` section: other servers (llama-swap or swaplab) whose models this router forwards to."""

from __future__ import annotations

from swaplab.config.model import PeerConfig
from swaplab.config.upstream import is_http_url, read_filters, read_timeouts
from swaplab.config.translate import read_translate
from swaplab.config.yamlreader import YamlSection, shown


def read_peers(section: YamlSection | None) -> dict[str, PeerConfig]:
    """Each peer (global macros already expanded): a proxy URL and at least one model are required."""
    peers: dict[str, PeerConfig] = {}
    if section is None:
        return peers
    for peer_id, entry in section.entries.items():
        section.read_keys.add(peer_id)
        path = section.where(peer_id)
        if not entry.item.is_mapping:
            section.fault(entry, f"expected a mapping (proxy, apiKey, models, ...), got {shown(entry.item)}")
            continue
        peer = YamlSection(section.findings, entry.item, section.path + (peer_id,))
        proxy = peer.string("proxy")
        if not proxy:
            peer.findings.fault(entry.key_line, f"{path}: proxy is required")
        elif "${" not in proxy and not is_http_url(proxy):
            peer.fault(
                peer.entries["proxy"], f"invalid peer proxy URL ({proxy}): expected an http:// or https:// URL"
            )
        models: list[str] = []
        for model in peer.strings("models"):
            if model.text not in models:
                models.append(model.text)
        models_entry = peer.entries.get("models")
        wrong_type = models_entry is not None and models_entry.item.value is not None and not models_entry.item.is_sequence
        if not models and not wrong_type:  # a wrong type is reported already
            peer.findings.fault(entry.key_line, f"{path}: peer models can not be empty")
        peers[peer_id] = PeerConfig(
            id=peer_id,
            proxy=proxy,
            api_key=peer.string("apiKey"),
            models=tuple(models),
            filters=read_filters(peer, legacy_names=False),
            timeouts=read_timeouts(peer, response_header=60.0),
            probe=peer.number("probe", 0.0) or 0.0,
            translate=read_translate(peer),
        )
        peer.finish()
    return peers
