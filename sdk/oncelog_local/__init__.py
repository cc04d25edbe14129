"""A whole oncelog cluster on one machine, each service its own OS process:
`LocalCluster` (cluster.py), with what it needs to run one — its children
(processes.py), the ports its services get (ports.py), the ports kept
across runs of a data dir (layout.py), the services' command lines
(argv.py), the wait until they serve (readiness.py), who holds each
partition (partitions.py), etcd members (etcd.py), a certificate authority
for a secured cluster (pki.py), network namespaces for real partitions
(netns.py), and the wrapper every child starts under (child.py).

It is the test-and-demo half of the project, kept out of the client's import
graph: `import oncelog` (Producer, Consumer, Admin) never imports it. Users
reach it as `oncelog.testing`, its public name (this package's __init__
imports nothing, so that the CLI can read layout.py without the server
extra); it runs the services, so it needs the server extra
(`pip install 'oncelog[server]'`).
"""
