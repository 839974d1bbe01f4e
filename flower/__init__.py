"""secagg over Flower: the same protocols and backends with clients on other machines.

- :mod:`~secagg.flower.messages`: a secagg envelope as bytes inside a Flower message;
- :mod:`~secagg.flower.transport`: the server's transport over Flower's ``Grid``;
- :mod:`~secagg.flower.process`: what each of secagg's processes on Flower sets up for
  itself, on either side (Flower's shorter wait for objects, the profiling diagnostic);
- :mod:`~secagg.flower.node`: a SuperNode's client, rebuilt from its own directory for every
  message (keys, model, optimizer copy and data position stay on the node);
- :mod:`~secagg.flower.apps`: the ServerApp and the ClientApp;
- :mod:`~secagg.flower.guard`: a SuperNode that runs the deployment's own App only
  (``secagg flower node``);
- :mod:`~secagg.flower.deployment`: keys, certificates and node directories for a
  deployment, and :mod:`~secagg.flower.launch` a local one (SuperLink and SuperNodes as
  separate processes).

Nothing of secagg's security rests on Flower's: TLS and node authentication protect the
transport, while confidentiality against the server comes from the backend, end to end.
"""
