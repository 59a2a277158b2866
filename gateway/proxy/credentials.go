package proxy

import (
	"context"
	"errors"
	"strconv"

	"sandbox-bridge.io/gateway/resolver"
	"sandbox-bridge.io/gateway/source"
)

// credentials returns the headers to inject for box's requests to host: those registered on the
// box win; else, when the pool has a credential resolver asked about host, its answer (cached by
// the resolver client). from says which ("registered", "resolver", "" for none). An error means
// the resolver could not be asked or answered wrongly: the connection is refused (502), never
// sent without the credentials.
func (p *Proxy) credentials(ctx context.Context, st *source.State, rec *record, box *source.Box, host, port string) (headers map[string]string, from string, err error) {
	if h := box.Headers(host); h != nil {
		return h, "registered", nil
	}
	spec := st.Resolvers[box.Pool]
	if spec == nil || !spec.Covers(host) {
		return nil, "", nil
	}
	if p.cfg.Resolver == nil {
		return nil, "resolver", errors.New("the gateway has no resolver client")
	}
	n, _ := strconv.Atoi(port)
	h, err := p.cfg.Resolver.Headers(ctx, spec, resolver.Query{
		BoxID: rec.box, Pool: box.Pool, Host: host, Port: n,
		TenantID: box.Outbound.TenantID, SessionID: box.Outbound.SessionID,
	})
	return h, "resolver", err
}
