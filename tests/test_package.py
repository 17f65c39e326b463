"""Package-level behaviour."""
import subprocess
import sys


def test_import_keeps_the_users_float64_setting():
    code = ('import jax; jax.config.update("jax_enable_x64", True); import braintrace_conv, '
            'brainstate; import jax.numpy as jnp; assert jax.config.jax_enable_x64; '
            'assert brainstate.ParamState(jnp.ones(2)).value.dtype == jnp.float64')
    subprocess.run([sys.executable, '-c', code], check=True)


def test_public_surface():
    import braintrace_conv as bc
    for name in ('conv', 'dense', 'register_primitive', 'ETPPrimitive', 'BPTT', 'D_RTRL',
                 'ES_D_RTRL', 'Trainer'):
        assert name in bc.__all__ and getattr(bc, name).__doc__


def test_one_switch_sets_float64_for_jax_and_brainstate():
    code = ('import braintrace_conv as bc, brainstate, jax.numpy as jnp; bc.use_float64(); '
            'assert brainstate.ParamState(jnp.ones(2)).value.dtype == jnp.float64; '
            'assert jnp.asarray(1.0).dtype == jnp.float64; bc.use_float64(False); '
            'assert brainstate.ParamState(jnp.ones(2)).value.dtype == jnp.float32; '
            'assert jnp.asarray(1.0).dtype == jnp.float32')
    subprocess.run([sys.executable, '-c', code], check=True)


def test_the_float64_switch_takes_a_bool():
    import pytest
    import braintrace_conv as bc
    with pytest.raises(TypeError, match='use_float64 takes True or False'):
        bc.use_float64('yes')


def test_every_extension_point_is_in_extend():
    import braintrace_conv as bc
    from braintrace_conv import extend
    assert extend.register_primitive is bc.register_primitive
    assert extend.register_elementwise is bc.register_elementwise
    assert extend.OnlineLearner is bc.executors.OnlineLearner
    for name in extend.__all__:
        assert getattr(extend, name) is not None


def test_the_old_register_lift_path_warns_and_still_works():
    import pytest
    from braintrace_conv import extend
    with pytest.warns(DeprecationWarning, match='braintrace_conv.extend.register_lift'):
        from braintrace_conv.lift import register_lift
    assert register_lift is extend.register_lift
    with pytest.raises(ImportError):
        from braintrace_conv.lift import no_such_name  # noqa: F401


def test_subpackages_are_attributes_of_the_package():
    import subprocess
    import sys
    code = 'import braintrace_conv as bc; print(bc.nn.LIF.__name__, bc.data.encoders.__name__)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ['LIF', 'braintrace_conv.data.encoders']
