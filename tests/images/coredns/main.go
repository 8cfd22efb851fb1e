// Test infrastructure only: CoreDNS with the plugins of the Corefile kubeadm writes (errors,
// health, ready, kubernetes, prometheus, forward, cache, loop, reload, loadbalance) and a few
// an operator adds to it (log, hosts, rewrite), instead of every plugin: CoreDNS's own main
// links the cloud DNS plugins with the Azure, AWS and Google SDKs, which took most of the
// test bed's CoreDNS build (issue 35). A custom main importing coremain and the wanted plugins
// is CoreDNS's documented way to choose plugins at compile time; the directive order stays
// CoreDNS's own (core/dnsserver), so a Corefile behaves as in the upstream image.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
)

func main() {
	coremain.Run()
}
