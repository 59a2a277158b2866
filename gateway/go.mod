module sandbox-bridge.io/gateway

go 1.25.0
