//! The resolver of the front's client for user code's requests: a name's addresses, those of a
//! special class left out unless `--allow-net` names them literally
//! ([`AllowList::admits_address`]). It runs when the client connects, so the addresses checked
//! are the ones connected to: a name that resolves to a public address for the check and to
//! `127.0.0.1` for the connection (DNS rebinding) cannot happen.

use super::allow_list::AllowList;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use thiserror::Error;

/// A name whose every address is of a special class that `--allow-net` does not name.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{name} resolves to {address}, {class}, which --allow-net does not name (a listed name reaches only public addresses; list the address or its range to reach it)")]
pub struct AddressRefused {
    /// The name asked for.
    pub name: String,
    /// The first address it resolved to.
    pub address: IpAddr,
    /// The address's class, in words.
    pub class: &'static str,
}

/// The resolver (see the module's documentation).
pub struct CheckedResolver {
    allow: Arc<AllowList>,
}

impl CheckedResolver {
    /// A resolver that admits the addresses `allow` admits.
    pub fn new(allow: Arc<AllowList>) -> CheckedResolver {
        CheckedResolver { allow }
    }
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            // The port is the client's to set; 0 here, as reqwest's own resolver asks.
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let (admitted, refused) = admitted(&allow, found);
            match (admitted.is_empty(), refused) {
                (true, Some((address, class))) => Err(Box::new(AddressRefused {
                    name,
                    address,
                    class,
                }) as _),
                _ => Ok(Box::new(admitted.into_iter()) as Addrs),
            }
        })
    }
}

/// The addresses of `found` that `allow` admits, and the first one it did not, with its class.
fn admitted(
    allow: &AllowList,
    found: Vec<SocketAddr>,
) -> (Vec<SocketAddr>, Option<(IpAddr, &'static str)>) {
    let mut refused = None;
    let admitted = found
        .into_iter()
        .filter(|addr| match allow.admits_address(addr.ip(), None) {
            Ok(()) => true,
            Err(class) => {
                refused.get_or_insert((addr.ip(), class));
                false
            }
        })
        .collect();
    (admitted, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listed_name_that_resolves_to_loopback_reaches_nothing() {
        let allow = Arc::new(AllowList::parse(&["localhost".to_owned()]).expect("valid"));
        let resolver = CheckedResolver::new(allow);
        let name: Name = "localhost".parse().expect("name");
        let Err(refused) = resolver.resolve(name).await else {
            panic!("localhost was admitted");
        };
        let refused = refused.downcast::<AddressRefused>().expect("ours");
        assert_eq!(refused.class, "a loopback address");
        assert!(refused.address.is_loopback());
    }

    #[tokio::test]
    async fn a_name_resolves_when_its_address_is_listed() {
        let listed = [
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        let resolver = CheckedResolver::new(Arc::new(AllowList::parse(&listed).expect("valid")));
        let found: Vec<SocketAddr> = resolver
            .resolve("localhost".parse().expect("name"))
            .await
            .expect("admitted")
            .collect();
        assert!(!found.is_empty() && found.iter().all(|a| a.ip().is_loopback()));
    }

    #[test]
    fn public_addresses_stay_and_special_ones_go() {
        let allow = AllowList::default();
        let found = vec![
            "10.0.0.1:0".parse().expect("addr"),
            "93.184.216.34:0".parse().expect("addr"),
        ];
        let (kept, refused) = admitted(&allow, found);
        assert_eq!(
            kept,
            ["93.184.216.34:0".parse::<SocketAddr>().expect("addr")]
        );
        assert_eq!(refused.map(|(_, class)| class), Some("a private address"));
    }
}
