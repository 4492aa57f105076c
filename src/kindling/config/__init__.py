"""From config to objects: building objects checked against their signatures, the
config tree a run saves, and the resolvers the configs use. Imports only `kindling.errors` and
`kindling.run.run_folder` (the run folders' resolvers), neither loading torch (and the timm
model, for `${pretrained_input:...}`, when a config names it)."""
