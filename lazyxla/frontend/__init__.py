"""The PyTorch front end (stage 1 of the flow: **torch op -> IR node** -> sync -> collect -> hash
-> cache -> lower -> compile -> execute -> buffers): what PyTorch code on ``lazyxla.device()``
meets. An op on a lazy tensor records an IR node instead of running.

Holds ``device`` (PrivateUse1 renamed ``lazyxla``, ``torch.lazyxla``, ``lazyxla.device()``),
``tensor`` (``LazyTensor`` and the warm path: torch op -> signature key -> IR node, no meta
shape inference once a signature is known), ``signature`` (the cold path, once per signature:
meta shape inference, the op's template, the lowering check, user errors), ``checks`` (what
PyTorch refuses, refused at the user's line), ``ops`` (ops with handling of their own: aliases,
copies, ``.item()``, ``resize_``, foreach, decompositions, the CPU fallback with its
``aten::<op>`` counter), ``kernels`` (factories, uploads, recurrent layers, the PrivateUse1
fallback), ``autocast`` (``torch.autocast("lazyxla")``'s policy) and ``param_moves``
(``model.to(device)``: new Parameters, their names, tied weights kept tied).

May import: ``engine`` (a value read, eager mode), ``compiler`` (the persistent
cache's memory of lowering checks), ``run``, ``lowering``, ``ir``, ``xla`` and the shared
modules. Imported by ``regions``, ``optim``, ``replay`` and everything above them; the stages
below never call back into it.
"""
