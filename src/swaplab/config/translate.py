"""A model's or peer's `translate:`: which of Anthropic's and OpenAI's newer APIs its server lacks.

    translate: {messages: true, responses: true}

`true`: the server lacks the API; the router serves it over the server's chat completions
(`router.translate`). `false`: the server has it; a 404 there is the server's own answer and
is passed on. Absent (the default): known from the engine (TabbyAPI lacks both), else
learned from the server's first 404 on the route.
"""

from __future__ import annotations

from swaplab.config.yamlreader import YamlSection, shown

APIS = ("messages", "responses")


def read_translate(section: YamlSection) -> dict[str, bool]:
    """The entry's `translate:` mapping (API name -> whether the router translates it); {} when absent."""
    entry = section.entry("translate")
    if entry is None:
        return {}
    if not entry.item.is_mapping:
        section.fault(entry, f"expected a mapping such as {{messages: true, responses: true}}, got {shown(entry.item)}")
        return {}
    apis = YamlSection(section.findings, entry.item, section.path + ("translate",))
    declared = {api: apis.boolean(api, False) for api in APIS if api in apis.entries}
    apis.read_keys.update(APIS)
    apis.finish()
    return declared
