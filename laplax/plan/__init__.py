"""A plan before the spend: what a config does on a machine, before it is rented.

    python -m laplax.plan --config configs/gpt_d20.py --target v5e:4x4
    python -m laplax.plan --config configs/nystrom_lra.py:task=text --target gpu:8xH100 --json
    python -m laplax.plan --config configs/bert_glue.py --target v5e:8x8 --config.batch_size=64

``--config`` and ``--config.KEY=VALUE`` are ``train.py``'s (the same parsing,
:mod:`laplax.cli.common`); ``--target`` names the machine
(:func:`laplax.plan.targets.parse_target`: ``v5e:4x4``, ``v5e:8x8``,
``v5p:2x2x2``, ``gpu:8xH100``, ``gpu:2x8xH100``). It prints, without any
accelerator:

* the machine: chips, hosts (one ``train.py`` process each) and chips a host;
* the mesh ``(data, fsdp, tensor)`` as :mod:`laplax.sharding` builds it for that
  many devices, and the axes the batch is split over;
* the data split: global batch, per host, per device, micro-batches
  (``optim.grad_accum_steps``), tokens an example, a streamed data set's
  streams;
* every refusal ``train.py`` would print on that machine, one line each,
  naming the key to change (:func:`laplax.plan.report.refusals`: the
  validation the trainer runs, with the target's device and process counts);
* a lower bound on the step time and the whole run's hours and chip-hours
  (:mod:`laplax.plan.roofline`, from the analytic FLOPs of
  :mod:`laplax.plan.flops` and the bytes a step must move, against the chip's
  published peaks, :mod:`laplax.plan.targets`);
* an analytic estimate of the memory per device (:mod:`laplax.plan.memory`);
  with ``--compile`` on a TPU target and libtpu installed, the compiled train
  step's memory per chip (:mod:`laplax.plan.aot`), else the command that gets it.

Exit codes: 0 when the config can run on the target, 2 (each refusal an
``error:`` line on stderr) when it cannot or the command line is wrong.
``--json`` prints the plan as one JSON object (keys of
:func:`laplax.plan.report.make_plan`).
"""
