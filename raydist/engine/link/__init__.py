"""The node link: how a cluster's driver and each node's supervisor speak.

``wire`` frames lines and seals them; ``keys`` says who may speak and how each
end proves it; ``handshake`` admits a connection on the driver's side;
``channel`` is the driver's end for every node, ``nodelink`` what it knows of
one; ``relay`` is the far end inside the cluster for a driver nobody can
dial; ``limits`` raises the process limits a driver of many nodes needs."""
