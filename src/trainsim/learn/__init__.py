"""Black-box stage-latency prediction (paper 003, PredTOP): stage graphs, DAG Transformer, GNNs.

Modules (imported on use; torch, torch-geometric and jax are the ``learn`` extra):

- :mod:`.stages` — GPT and MoE pipeline stages in JAX; timing a stage on this CPU.
- :mod:`.graphs` — stage DAGs from a jaxpr or a torch.fx graph, pruning, Table I features, Eq. 1 mask.
- :mod:`.dataset` — sampling stages, resumable measurement with provenance (``python -m trainsim.learn.dataset``).
- :mod:`.models` — DAG Transformer, GCN, GAT.
- :mod:`.train` — training (MAE, Adam, cosine decay, early stopping), safetensors artifacts.
- :mod:`.evaluate` — MRE against the training fraction per family (003 Tables V/VI).
- :mod:`.provider` — stage-latency providers, the Eq. 4 pipeline search, the §VIII-B experiment.
- :mod:`.predictions` — a trained predictor's answers for a dataset, described stages, a search (``trainsim stages``).
- :mod:`.suite` — ``trainsim validate predtop``.

>>> from trainsim.learn.provider import SEARCH_MODELS, best_pipeline
>>> lat = {(0, 1, 1): 1.0, (1, 2, 1): 1.0, (0, 2, 1): 1.5, (0, 2, 2): 0.9}
>>> best_pipeline(lat, layers=2, devices=2, microbatches=8).label()
'L0-1×2'
"""
