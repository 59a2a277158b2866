# syntax=docker/dockerfile:1
# One image, both programs:
#   bridge   (default)  docker run IMAGE
#              -> node --max-semi-space-size=4 --heap-growing-percent=50 dist/bridge/main.js
#   operator            docker run IMAGE --optimize-for-size dist/operator/main.js
# The ENTRYPOINT is node alone; each program's V8 flags come before its script (CMD here, the
# chart's args for both Deployments), as common/node-flags.ts lists them per program.
# and, as separate targets, the in-box agent that box pods' init container copies in, and the
# egress gateway:
#   boxd                docker build --target boxd -t IMAGE-boxd .  (scratch: only /boxd)
#   egress-gateway      docker build --target egress-gateway -t IMAGE-egress-gateway .
#                       (scratch: /egress-gateway and the public CA roots it verifies hosts with)
# Node 24 LTS. Runs as uid/gid 65534 and writes nothing, so it works with a read-only root
# filesystem. No init (tini): node is PID 1 and both programs handle SIGTERM themselves
# (graceful shutdown, exit 0) and start no child processes, so there is nothing to reap.
# Checked by test/integration/chart-dockerfile.test.ts (no Docker engine in CI).

# --- build: full dev toolchain, compiles TypeScript to dist/ ---------------------------------
FROM node:24-bookworm-slim AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY common ./common
COPY bridge ./bridge
COPY operator ./operator
RUN npm run build

# --- deps: production dependencies only ------------------------------------------------------
# A separate `npm ci --omit=dev`, never a copy of the build stage's node_modules: the
# devDependency `node` (a whole Node binary), jest, typescript etc. must not reach the image.
# --ignore-scripts: no runtime dependency needs an install script.
FROM node:24-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
 && test ! -e node_modules/node \
 && npm cache clean --force

# --- boxd: the in-box agent, one static Go binary (boxd/build.sh: CGO off, stripped) ----------
FROM golang:1.26-bookworm AS boxd-build
WORKDIR /src/boxd
COPY boxd ./
ARG BOXD_VERSION=dev
RUN BOXD_VERSION=${BOXD_VERSION} GOTOOLCHAIN=local ./build.sh /out

# Nothing but the binary; the init container runs `/boxd install <emptyDir>` as 65534.
FROM scratch AS boxd
COPY --from=boxd-build /out/boxd /boxd
USER 65534:65534
ENTRYPOINT ["/boxd"]

# --- egress-gateway: the boxes' HTTP proxy, one static Go binary (gateway/build.sh) -----------
FROM golang:1.26-bookworm AS egress-gateway-build
WORKDIR /src/gateway
COPY gateway ./
ARG GATEWAY_VERSION=dev
RUN GATEWAY_VERSION=${GATEWAY_VERSION} GOTOOLCHAIN=local ./build.sh /out

# The binary and Debian's CA bundle: Go reads /etc/ssl/certs/ca-certificates.crt as its system
# roots, which verify the hosts the gateway intercepts (scratch has none). The API server's CA
# comes with the pod's service account. Run as 65534 with a read-only root (the chart).
FROM scratch AS egress-gateway
COPY --from=egress-gateway-build /out/egress-gateway /egress-gateway
COPY --from=egress-gateway-build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
USER 65534:65534
EXPOSE 3128 9090
ENTRYPOINT ["/egress-gateway"]

# --- runtime: distroless Node 24 (no shell, no package manager) ------------------------------
FROM gcr.io/distroless/nodejs24-debian12 AS runtime
LABEL org.opencontainers.image.title="sandbox-bridge" \
      org.opencontainers.image.description="sandbox-bridge bridge and operator" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /app
ENV NODE_ENV=production \
    NODE_OPTIONS=--enable-source-maps
# Owned by root and not writable by 65534: the code cannot be modified at run time.
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY package.json ./
USER 65534:65534
EXPOSE 8080 9090
ENTRYPOINT ["/nodejs/bin/node"]
CMD ["--max-semi-space-size=4", "--heap-growing-percent=50", "dist/bridge/main.js"]
