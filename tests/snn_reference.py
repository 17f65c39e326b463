"""Shared pieces of the executor tests: error measures, a user-style spike function, a loss."""
import jax
import jax.numpy as jnp
import numpy as np

#: Relative error bound where the theory says exact (float64).
EXACT = 1e-6


def rel_err(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def cosine(ga, gb):
    a = np.concatenate([np.ravel(v) for v in jax.tree.leaves(ga)])
    b = np.concatenate([np.ravel(v) for v in jax.tree.leaves(gb)])
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def spike(x):
    """Heaviside with a sigmoid surrogate derivative (slope 4), as users define it."""
    @jax.custom_jvp
    def heaviside(x):
        return (x > 0).astype(x.dtype)

    @heaviside.defjvp
    def _jvp(primals, tangents):
        (x,), (dx,) = primals, tangents
        s = jax.nn.sigmoid(4.0 * x)
        return heaviside(x), dx * 4.0 * s * (1 - s)

    return heaviside(x)


@jax.custom_vjp
def spike_vjp(x):
    """The same spike written with ``jax.custom_vjp``, the other common JAX style."""
    return (x > 0).astype(x.dtype)


def _spike_fwd(x):
    return spike_vjp(x), x


def _spike_bwd(x, ct):
    s = jax.nn.sigmoid(4.0 * x)
    return (ct * 4.0 * s * (1 - s),)


spike_vjp.defvjp(_spike_fwd, _spike_bwd)


def xent(out, label):
    """Mean softmax cross-entropy of ``out (B, K)`` for integer labels ``(B,)``."""
    return -jnp.mean(jax.nn.log_softmax(out)[jnp.arange(out.shape[0]), label])
