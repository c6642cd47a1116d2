"""Projects built on the library, each one package: :mod:`laplax.proj.nanochat`
(Karpathy's nanochat reproduced: chat stages, chat data, the chat benchmarks
and CORE, nanochat's optimisers, the chat program). As big_vision's ``proj/``,
a project imports the library, never the other way round; the library finds
a project's evaluators, optimisers and inputs through :mod:`laplax.projects`.
"""
