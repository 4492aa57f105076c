"""From config to objects: `UserError`, building objects checked against their signatures, the
config tree a run saves, and the resolvers the configs use. Imports nothing else of kindling."""
