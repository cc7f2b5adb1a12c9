"""Running our variants: inputs and references, the harness, instrumented iterations, preflight, known answers, the profile driver, and `taxes trace`'s recorder."""
