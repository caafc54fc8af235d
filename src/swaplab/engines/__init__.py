"""What each engine swaplab runs is (vLLM, SGLang, llama.cpp, TabbyAPI), taken from its release.

`contract(engine)` reads an engine's fixture (`contracts/<engine>.yaml`, every fact with its
`file:line` origin in the release); `engine_of(argv)` says which engine a command runs. The
sim's personalities, `config check`, the fleet's calls to an engine and the memory claims all
read these, so the sim cannot drift from the engines unnoticed.
"""

from swaplab.engines.commandline import command_env, engine_of, flag_value, flag_values, has_flag
from swaplab.engines.contract import ENGINES, Contract, EngineName, contract

__all__ = [
    "ENGINES", "Contract", "EngineName", "command_env", "contract", "engine_of", "flag_value", "flag_values",
    "has_flag",
]
