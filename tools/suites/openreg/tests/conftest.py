# Harness conftest for torch_openreg's test files adapted to "tpu" (tools/suites/openreg;
# adapt.sh copies it beside the adapted files).
import pytest
import torch_tpu_eager  # noqa: F401
import torch.testing._internal.common_device_type as _cdt
import torch.testing._internal.common_methods_invocations as _cmi

# test_opinfo.py imports these from common_methods_invocations; torch 2.13 has them in
# common_device_type, skipOps taking the skip specs alone.
if not hasattr(_cmi, "skip"):
    _cmi.skip = _cdt.skip
if not hasattr(_cmi, "skipOps"):
    _cmi.skipOps = lambda _cls, _test, specs: _cdt.skipOps(specs)

_CUSTOM_OPS = "C++ custom ops of openreg's own extension (torch.ops.openreg.*)"
_BACKEND_META = (
    "openreg's BackendMeta serialization hook (registered in C++ by openreg; "
    "CUDA registers none, get_tensor_metadata stays {} as on tpu)"
)
_OFFSET = "torch.openreg.set_offset/get_offset: openreg-only module functions (torch.cuda has none)"
NOT_APPLICABLE = {
    "test_ops.py": {
        "test_compile_autograd_function_returns_self": _CUSTOM_OPS,
        "test_compile_autograd_function_aliasing": _CUSTOM_OPS,
        "test_custom_abs": _CUSTOM_OPS,
        "test_custom_autograd_fn_returns_self_basic": _CUSTOM_OPS,
        "test_custom_autograd_fn_aliasing_basic": _CUSTOM_OPS,
        "test_custom_autograd_fn_returns_self_no_grad": _CUSTOM_OPS,
        "test_custom_autograd_fn_aliasing_no_grad": _CUSTOM_OPS,
    },
    "test_storage.py": {
        "test_serialization": _BACKEND_META,
        "test_copy_backend_meta": _BACKEND_META,
        "test_serialization_metadata_preservation": _BACKEND_META,
        "test_fake_tensor_metadata_preservation": _BACKEND_META,
        "test_fake_tensor_metadata_preservation_functional": _BACKEND_META,
    },
    "test_compile.py": {"test_backend_metadata_propagation": _BACKEND_META},
    "test_rng.py": {"test_offset_unsupported": _OFFSET},
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = NOT_APPLICABLE.get(item.path.name, {}).get(item.name)
        if reason:
            item.add_marker(pytest.mark.skip(reason="NOT APPLICABLE: " + reason))
