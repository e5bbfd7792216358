"""Run upstream KERMT's ``main.py predict`` path in this process (used by the export test in a subprocess).

Usage: PYTHONPATH=<upstream checkout> python upstream_predict.py CKPT_DIR=OUT_CSV [CKPT_DIR=OUT_CSV ...] -- FLAGS
(one ``main.py predict --checkpoint_dir CKPT_DIR --output_path OUT_CSV FLAGS`` per pair, in one process so the
upstream imports are paid once).

cuik_molmaker is stubbed (upstream imports it unconditionally; it is not installable offline) and ``args.gpu`` is
set to None so upstream skips ``torch.cuda.set_device`` on a CPU machine. No numerics are touched.
"""

import sys
import types



def _unavailable(*_args, **_kwargs):
    raise RuntimeError("cuik_molmaker is stubbed out in this test")


def _stub_attribute(attribute):
    if attribute.startswith("__"):
        raise AttributeError(attribute)
    return _unavailable


for name in ("cuik_molmaker", "cuik_molmaker.mol_features"):
    stub = types.ModuleType(name)
    stub.__getattr__ = _stub_attribute  # PEP 562: any public attribute resolves to the stub function
    sys.modules[name] = stub
sys.modules["cuik_molmaker"].mol_features = sys.modules["cuik_molmaker.mol_features"]

from kermt.util.parsing import get_newest_train_args, parse_args  # noqa: E402 - upstream's, after the stubs
from task.predict import make_predictions, write_prediction  # noqa: E402 - upstream's too

separator = sys.argv.index("--")
pairs, flags = sys.argv[1:separator], sys.argv[separator + 1:]
for pair in pairs:
    checkpoint_dir, output = pair.split("=")
    sys.argv = ["main.py", "predict", "--checkpoint_dir", checkpoint_dir, "--output_path", output, *flags]
    args = parse_args()
    args.gpu = None
    preds, smiles = make_predictions(args, get_newest_train_args())
    write_prediction(preds, smiles, args)
