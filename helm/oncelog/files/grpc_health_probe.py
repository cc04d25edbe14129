"""The chart's exec probe: one gRPC health check (grpc.health.v1) over TLS.

Kubernetes' built-in grpc probe speaks plain text only (the kubelet dials
with insecure credentials and has no TLS settings), so once the services
serve TLS it cannot reach them. The chart mounts this file from a ConfigMap
and runs it with the image's own Python as an exec probe inside the
container: it dials the process over loopback with the pod's own
certificate (the service's certificate, which is also its client
certificate, so it passes `--tls-client-auth required`), verifies the
server against the mounted CA under the pod's own DNS name (the name every
peer verifies; loopback addresses are not in the certificate), and asks for
the overall status. The files are read on every run, so a rotated
certificate is what the next probe uses.

Exit status 0 when the answer is SERVING, 1 otherwise (refused, TLS failure,
timeout, NOT_SERVING), with the reason on stderr, which the kubelet records
in the pod's events.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The pod's name, from the downward API; with --server-name-suffix it makes
# the pod's DNS name <pod>.<headless service>.<namespace>.svc.<domain>.
POD_NAME_ENV = "POD_NAME"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to dial (loopback; ::1 for IPv6-only pods)")
    parser.add_argument("--port", type=int, required=True, help="the gRPC port")
    parser.add_argument("--ca-file", required=True, help="CA bundle that signed the server")
    parser.add_argument("--cert-file", required=True, help="client certificate chain (PEM)")
    parser.add_argument("--key-file", required=True, help="client private key (PEM)")
    name = parser.add_mutually_exclusive_group(required=True)
    name.add_argument("--server-name", help="the name the server certificate must carry")
    name.add_argument("--server-name-suffix",
                      help=f"the name is ${POD_NAME_ENV} followed by this suffix")
    parser.add_argument("--service", default="",
                        help="health service name (empty: the process's overall status)")
    parser.add_argument("--timeout-s", type=float, default=2.0,
                        help="deadline of the health call in seconds")
    return parser


def _server_name(args: argparse.Namespace) -> str:
    if args.server_name:
        return str(args.server_name)
    pod = os.environ.get(POD_NAME_ENV, "")
    if not pod:
        raise SystemExit(f"probe: ${POD_NAME_ENV} is not set; the server name is "
                         f"${POD_NAME_ENV}{args.server_name_suffix}")
    return pod + str(args.server_name_suffix)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SystemExit(f"probe: cannot read the {what} {path}: {exc.strerror}") from exc


def check(args: argparse.Namespace) -> tuple[bool, str]:
    """(serving, what was found) for one health call."""
    server_name = _server_name(args)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(args.ca_file, "CA bundle"),
        private_key=_read(args.key_file, "private key"),
        certificate_chain=_read(args.cert_file, "certificate"),
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    target = f"{host}:{args.port}"
    options = [
        # Verify the certificate against the pod's DNS name while dialling
        # loopback.
        ("grpc.ssl_target_name_override", server_name),
        # A proxy from the container's environment must not carry a probe.
        ("grpc.enable_http_proxy", 0),
    ]
    with grpc.secure_channel(target, credentials, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=args.service),
                                  timeout=args.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "ERROR"
            return False, f"health check of {target} as {server_name} failed: {name}: {details}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    serving, found = check(args)
    print(found, file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
