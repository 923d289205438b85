// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Vm} from "forge-std/Test.sol";
import {TestUSDC} from "../src/TestUSDC.sol";
import {Eip3009Helper} from "./utils/Eip3009Helper.sol";
import {MockERC1271Wallet} from "./utils/Mocks.sol";

contract TestUSDCTest is Eip3009Helper {
    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    event AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce);

    // Revert strings of Circle's FiatToken v2.2 (the x402 ecosystem matches on them).
    bytes internal constant E_NOT_YET_VALID = "FiatTokenV2: authorization is not yet valid";
    bytes internal constant E_EXPIRED = "FiatTokenV2: authorization is expired";
    bytes internal constant E_USED = "FiatTokenV2: authorization is used or canceled";
    bytes internal constant E_INVALID_SIG = "FiatTokenV2: invalid signature";
    bytes internal constant E_NOT_PAYEE = "FiatTokenV2: caller must be the payee";
    bytes internal constant E_S_VALUE = "ECRecover: invalid signature 's' value";
    bytes internal constant E_V_VALUE = "ECRecover: invalid signature 'v' value";
    bytes internal constant E_SIG_LENGTH = "ECRecover: invalid signature length";
    bytes internal constant E_ECRECOVER = "ECRecover: invalid signature";
    bytes internal constant E_BALANCE = "ERC20: transfer amount exceeds balance";
    bytes internal constant E_ALLOWANCE = "ERC20: transfer amount exceeds allowance";
    bytes internal constant E_TO_ZERO = "ERC20: transfer to the zero address";

    TestUSDC internal usdc;
    bytes32 internal domain;

    uint256 internal constant ALICE_PK = 0xA11CE;
    uint256 internal constant MALLORY_PK = 0xBAD;
    address internal alice;
    address internal mallory;
    address internal bob = makeAddr("bob");
    address internal relayer = makeAddr("relayer");

    uint256 internal constant NOW = 1_700_000_000;

    function setUp() public {
        vm.warp(NOW);
        usdc = new TestUSDC("USD Coin", "2");
        domain = _domain(address(usdc), "USD Coin", "2", block.chainid);
        alice = vm.addr(ALICE_PK);
        mallory = vm.addr(MALLORY_PK);
        usdc.mint(alice, 1_000e6);
    }

    function _auth(address to, uint256 value, bytes32 nonce) internal view returns (Auth memory) {
        return
            Auth({
                from: alice, to: to, value: value, validAfter: NOW - 1, validBefore: NOW + 60, nonce: nonce
            });
    }

    function _sign(uint256 pk, bytes32 typehash, Auth memory a)
        internal
        view
        returns (uint8 v, bytes32 r, bytes32 s)
    {
        return vm.sign(pk, _authDigest(domain, typehash, a));
    }

    function _transferVrs(Auth memory a, uint8 v, bytes32 r, bytes32 s) internal {
        usdc.transferWithAuthorization(a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, v, r, s);
    }

    function _transferBytes(Auth memory a, bytes memory sig) internal {
        usdc.transferWithAuthorization(a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, sig);
    }

    function _receiveVrs(Auth memory a, uint8 v, bytes32 r, bytes32 s) internal {
        usdc.receiveWithAuthorization(a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, v, r, s);
    }

    function _receiveBytes(Auth memory a, bytes memory sig) internal {
        usdc.receiveWithAuthorization(a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, sig);
    }

    // ================================================================== metadata / EIP-712

    function test_metadata() public view {
        assertEq(usdc.name(), "USD Coin");
        assertEq(usdc.symbol(), "USDC");
        assertEq(usdc.decimals(), 6);
        assertEq(usdc.version(), "2");
        assertEq(usdc.totalSupply(), 1_000e6);
    }

    function test_typehashesMatchCircleFiatToken() public view {
        // Values published in Circle's FiatToken v2 source.
        assertEq(
            usdc.TRANSFER_WITH_AUTHORIZATION_TYPEHASH(),
            0x7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267
        );
        assertEq(
            usdc.RECEIVE_WITH_AUTHORIZATION_TYPEHASH(),
            0xd099cc98ef71107a616c4f0f941f04c322d8e254fe26b3c6668db87aae413de8
        );
        assertEq(
            usdc.CANCEL_AUTHORIZATION_TYPEHASH(),
            0x158b0a9edf7a828aad02f63cd515c68ef2f50ba807396f6d12842833a1597429
        );
        assertEq(usdc.TRANSFER_WITH_AUTHORIZATION_TYPEHASH(), TRANSFER_TYPEHASH);
        assertEq(usdc.RECEIVE_WITH_AUTHORIZATION_TYPEHASH(), RECEIVE_TYPEHASH);
        assertEq(usdc.CANCEL_AUTHORIZATION_TYPEHASH(), CANCEL_TYPEHASH);
        assertEq(DOMAIN_TYPEHASH, 0x8b73c3c69bb8fe3d512ecc4cf759cc79239f7b179b0ffacaa9a75d522b39400f);
    }

    function test_domainSeparator_matchesSpec() public view {
        assertEq(usdc.DOMAIN_SEPARATOR(), domain);
    }

    function test_domainSeparator_constructorParams() public {
        TestUSDC sepolia = new TestUSDC("USDC", "2");
        assertEq(sepolia.name(), "USDC");
        assertEq(sepolia.DOMAIN_SEPARATOR(), _domain(address(sepolia), "USDC", "2", block.chainid));
        assertTrue(sepolia.DOMAIN_SEPARATOR() != usdc.DOMAIN_SEPARATOR());
    }

    function test_domainSeparator_recomputedWhenChainIdChanges() public {
        bytes32 before = usdc.DOMAIN_SEPARATOR();
        vm.chainId(8453);
        bytes32 afterFork = usdc.DOMAIN_SEPARATOR();
        assertTrue(afterFork != before);
        assertEq(afterFork, _domain(address(usdc), "USD Coin", "2", 8453));
        (,,, uint256 chainId,,,) = usdc.eip712Domain();
        assertEq(chainId, 8453);
    }

    function test_signatureFromOldChainRejectedAfterChainIdChange() public {
        Auth memory a = _auth(bob, 1e6, bytes32(uint256(1)));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a); // signed for the deploy chain
        vm.chainId(8453);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(a, v, r, s);
        // A signature over the new domain works.
        domain = _domain(address(usdc), "USD Coin", "2", 8453);
        (v, r, s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        _transferVrs(a, v, r, s);
        assertEq(usdc.balanceOf(bob), 1e6);
    }

    function test_eip712Domain() public view {
        (
            bytes1 fields,
            string memory name,
            string memory version,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        ) = usdc.eip712Domain();
        assertEq(fields, hex"0f");
        assertEq(name, "USD Coin");
        assertEq(version, "2");
        assertEq(chainId, block.chainid);
        assertEq(verifyingContract, address(usdc));
        assertEq(salt, bytes32(0));
        assertEq(extensions.length, 0);
        assertEq(_domain(verifyingContract, name, version, chainId), usdc.DOMAIN_SEPARATOR());
    }

    function test_noPermitNoNonces() public {
        (bool ok,) = address(usdc).call(abi.encodeWithSignature("nonces(address)", alice));
        assertFalse(ok);
        (ok,) = address(usdc)
            .call(
                abi.encodeWithSignature(
                    "permit(address,address,uint256,uint256,uint8,bytes32,bytes32)",
                    alice,
                    bob,
                    1,
                    1,
                    27,
                    0,
                    0
                )
            );
        assertFalse(ok);
    }

    // ================================================================== ERC-20

    function test_mint() public {
        vm.expectEmit(true, true, false, true, address(usdc));
        emit Transfer(address(0), bob, 5e6);
        vm.prank(mallory); // open mint
        usdc.mint(bob, 5e6);
        assertEq(usdc.balanceOf(bob), 5e6);
        assertEq(usdc.totalSupply(), 1_005e6);
    }

    function test_mint_revertsToZeroAddress() public {
        vm.expectRevert(bytes("FiatToken: mint to the zero address"));
        usdc.mint(address(0), 1);
    }

    function test_mint_revertsZeroAmount() public {
        vm.expectRevert(bytes("FiatToken: mint amount not greater than 0"));
        usdc.mint(bob, 0);
    }

    function test_mint_revertsOnTotalSupplyOverflow() public {
        vm.expectRevert(); // arithmetic panic
        usdc.mint(bob, type(uint256).max);
    }

    function test_transfer() public {
        vm.expectEmit(true, true, false, true, address(usdc));
        emit Transfer(alice, bob, 10e6);
        vm.prank(alice);
        assertTrue(usdc.transfer(bob, 10e6));
        assertEq(usdc.balanceOf(alice), 990e6);
        assertEq(usdc.balanceOf(bob), 10e6);
    }

    function test_transfer_reverts() public {
        vm.startPrank(alice);
        vm.expectRevert(E_BALANCE);
        usdc.transfer(bob, 1_000e6 + 1);
        vm.expectRevert(E_TO_ZERO);
        usdc.transfer(address(0), 1);
        vm.stopPrank();
    }

    function test_approve_and_transferFrom() public {
        vm.expectEmit(true, true, false, true, address(usdc));
        emit Approval(alice, bob, 30e6);
        vm.prank(alice);
        assertTrue(usdc.approve(bob, 30e6));
        assertEq(usdc.allowance(alice, bob), 30e6);

        vm.prank(bob);
        assertTrue(usdc.transferFrom(alice, relayer, 20e6));
        assertEq(usdc.allowance(alice, bob), 10e6);
        assertEq(usdc.balanceOf(relayer), 20e6);

        vm.prank(bob);
        vm.expectRevert(E_ALLOWANCE);
        usdc.transferFrom(alice, relayer, 10e6 + 1);
    }

    function test_transferFrom_maxAllowanceIsDecreasedLikeFiatToken() public {
        vm.prank(alice);
        usdc.approve(bob, type(uint256).max);
        vm.prank(bob);
        usdc.transferFrom(alice, bob, 1);
        assertEq(usdc.allowance(alice, bob), type(uint256).max - 1);
    }

    function test_transferFrom_revertsOnBalanceEvenWithAllowance() public {
        vm.prank(alice);
        usdc.approve(bob, type(uint256).max);
        vm.prank(bob);
        vm.expectRevert(E_BALANCE);
        usdc.transferFrom(alice, bob, 1_000e6 + 1);
    }

    function test_approve_revertsToZeroAddress() public {
        vm.prank(alice);
        vm.expectRevert(bytes("ERC20: approve to the zero address"));
        usdc.approve(address(0), 1);
    }

    // ================================================================== transferWithAuthorization

    function test_transferWithAuthorization_vrs() public {
        Auth memory a = _auth(bob, 7e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);

        vm.expectEmit(true, true, false, true, address(usdc));
        emit AuthorizationUsed(alice, a.nonce);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit Transfer(alice, bob, 7e6);
        vm.prank(relayer); // anyone may submit
        _transferVrs(a, v, r, s);

        assertEq(usdc.balanceOf(alice), 993e6);
        assertEq(usdc.balanceOf(bob), 7e6);
        assertTrue(usdc.authorizationState(alice, a.nonce));
        assertFalse(usdc.authorizationState(bob, a.nonce), "state is per authorizer");
    }

    function test_transferWithAuthorization_bytes() public {
        Auth memory a = _auth(bob, 7e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit AuthorizationUsed(alice, a.nonce);
        _transferBytes(a, _pack(v, r, s));
        assertEq(usdc.balanceOf(bob), 7e6);
        assertTrue(usdc.authorizationState(alice, a.nonce));
    }

    function test_transferWithAuthorization_replayRejected_bothOverloads() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        _transferVrs(a, v, r, s);
        vm.expectRevert(E_USED);
        _transferVrs(a, v, r, s);
        vm.expectRevert(E_USED);
        _transferBytes(a, _pack(v, r, s));
        assertEq(usdc.balanceOf(bob), 1e6);
    }

    function test_transferWithAuthorization_nonceReuseWithOtherParamsRejected() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        _transferVrs(a, v, r, s);
        Auth memory b = _auth(relayer, 2e6, keccak256("n1"));
        (v, r, s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, b);
        vm.expectRevert(E_USED);
        _transferVrs(b, v, r, s);
    }

    function test_transferWithAuthorization_premature() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        a.validAfter = NOW; // valid only strictly after validAfter
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_NOT_YET_VALID);
        _transferVrs(a, v, r, s);
        vm.expectRevert(E_NOT_YET_VALID);
        _transferBytes(a, _pack(v, r, s));
        vm.warp(NOW + 1);
        _transferVrs(a, v, r, s);
        assertEq(usdc.balanceOf(bob), 1e6);
    }

    function test_transferWithAuthorization_expired() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.warp(a.validBefore); // valid only strictly before validBefore
        vm.expectRevert(E_EXPIRED);
        _transferVrs(a, v, r, s);
        vm.expectRevert(E_EXPIRED);
        _transferBytes(a, _pack(v, r, s));
        vm.warp(a.validBefore - 1);
        _transferVrs(a, v, r, s);
    }

    function test_transferWithAuthorization_wrongSigner() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(MALLORY_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(a, v, r, s);
        vm.expectRevert(E_INVALID_SIG);
        _transferBytes(a, _pack(v, r, s));
        assertFalse(usdc.authorizationState(alice, a.nonce));
    }

    function test_transferWithAuthorization_tamperedFieldsRejected() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        Auth memory t;

        t = Auth(a.from, a.to, a.value + 1, a.validAfter, a.validBefore, a.nonce);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(t, v, r, s);

        t = Auth(a.from, relayer, a.value, a.validAfter, a.validBefore, a.nonce);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(t, v, r, s);

        t = Auth(a.from, a.to, a.value, a.validAfter - 1, a.validBefore, a.nonce);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(t, v, r, s);

        t = Auth(a.from, a.to, a.value, a.validAfter, a.validBefore + 1, a.nonce);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(t, v, r, s);

        t = Auth(a.from, a.to, a.value, a.validAfter, a.validBefore, keccak256("n2"));
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(t, v, r, s);

        _transferVrs(a, v, r, s); // the untampered one still works
    }

    function test_transferWithAuthorization_otherTokenDomainRejected() public {
        TestUSDC other = new TestUSDC("USD Coin", "2");
        other.mint(alice, 10e6);
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a); // signed for `usdc`
        vm.expectRevert(E_INVALID_SIG);
        other.transferWithAuthorization(a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, v, r, s);
    }

    function test_transferWithAuthorization_wrongVersionDomainRejected() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        bytes32 d1 = _domain(address(usdc), "USD Coin", "1", block.chainid);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(ALICE_PK, _authDigest(d1, TRANSFER_TYPEHASH, a));
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(a, v, r, s);
    }

    function test_transferWithAuthorization_receiveSignatureNotAccepted() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(a, v, r, s);
    }

    function test_transferWithAuthorization_highSRejected() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        (uint8 v2, bytes32 r2, bytes32 s2) = _malleate(v, r, s);
        // The malleated signature is a valid ECDSA signature of the same digest...
        assertEq(ecrecover(_authDigest(domain, TRANSFER_TYPEHASH, a), v2, r2, s2), alice);
        // ...but EIP-2 forbids it.
        vm.expectRevert(E_S_VALUE);
        _transferVrs(a, v2, r2, s2);
        vm.expectRevert(E_S_VALUE);
        _transferBytes(a, _pack(v2, r2, s2));
        assertFalse(usdc.authorizationState(alice, a.nonce));
        _transferVrs(a, v, r, s);
        assertEq(usdc.balanceOf(bob), 1e6);
    }

    function test_transferWithAuthorization_badV() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_V_VALUE);
        _transferVrs(a, v - 27, r, s); // 0/1 style v is not normalised (like FiatToken)
        vm.expectRevert(E_V_VALUE);
        _transferVrs(a, 29, r, s);
    }

    function test_transferWithAuthorization_badSignatureLength() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_SIG_LENGTH);
        _transferBytes(a, abi.encodePacked(r, s)); // 64-byte EIP-2098 form not accepted
        vm.expectRevert(E_SIG_LENGTH);
        _transferBytes(a, abi.encodePacked(r, s, v, uint8(0)));
        vm.expectRevert(E_SIG_LENGTH);
        _transferBytes(a, "");
    }

    function test_transferWithAuthorization_unrecoverableSignature() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        vm.expectRevert(E_ECRECOVER);
        _transferVrs(a, 27, bytes32(0), bytes32(uint256(1))); // r = 0: ecrecover yields address(0)
    }

    function test_transferWithAuthorization_fromZeroAddressRejected() public {
        Auth memory a = _auth(bob, 0, keccak256("n1"));
        a.from = address(0);
        vm.expectRevert(E_ECRECOVER);
        _transferVrs(a, 27, bytes32(0), bytes32(uint256(1)));
    }

    function test_transferWithAuthorization_insufficientBalanceLeavesNonceUnused() public {
        Auth memory a = _auth(bob, 1_000e6 + 1, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_BALANCE);
        _transferVrs(a, v, r, s);
        assertFalse(usdc.authorizationState(alice, a.nonce));
        usdc.mint(alice, 1);
        _transferVrs(a, v, r, s);
        assertEq(usdc.balanceOf(alice), 0);
    }

    function test_transferWithAuthorization_toZeroAddressRejected() public {
        Auth memory a = _auth(address(0), 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_TO_ZERO);
        _transferVrs(a, v, r, s);
    }

    function test_transferWithAuthorization_checkOrderLikeFiatToken() public {
        // Expired + used + bad signature: the time window is checked first.
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        _transferVrs(a, v, r, s);
        vm.warp(a.validBefore + 1);
        vm.expectRevert(E_EXPIRED);
        _transferVrs(a, 27, bytes32(0), bytes32(0));
        // Used + bad signature: "used" before the signature.
        vm.warp(NOW);
        vm.expectRevert(E_USED);
        _transferVrs(a, 27, bytes32(0), bytes32(0));
        // Premature and expired at once: "not yet valid" wins.
        Auth memory b = _auth(bob, 1e6, keccak256("n2"));
        b.validAfter = NOW + 10;
        b.validBefore = NOW - 10;
        vm.expectRevert(E_NOT_YET_VALID);
        _transferVrs(b, 27, bytes32(0), bytes32(0));
    }

    function test_transferWithAuthorization_zeroValue() public {
        Auth memory a = _auth(bob, 0, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        _transferVrs(a, v, r, s);
        assertTrue(usdc.authorizationState(alice, a.nonce));
    }

    // ================================================================== receiveWithAuthorization

    function test_receiveWithAuthorization_vrs_and_bytes() public {
        Auth memory a = _auth(bob, 3e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit AuthorizationUsed(alice, a.nonce);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit Transfer(alice, bob, 3e6);
        vm.prank(bob);
        _receiveVrs(a, v, r, s);
        assertEq(usdc.balanceOf(bob), 3e6);

        Auth memory b = _auth(bob, 4e6, keccak256("n2"));
        (v, r, s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, b);
        vm.prank(bob);
        _receiveBytes(b, _pack(v, r, s));
        assertEq(usdc.balanceOf(bob), 7e6);
        assertTrue(usdc.authorizationState(alice, b.nonce));
    }

    function test_receiveWithAuthorization_callerMustBePayee() public {
        Auth memory a = _auth(bob, 3e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.startPrank(relayer);
        vm.expectRevert(E_NOT_PAYEE);
        _receiveVrs(a, v, r, s);
        vm.expectRevert(E_NOT_PAYEE);
        _receiveBytes(a, _pack(v, r, s));
        vm.stopPrank();
        // Payee check comes first, even before the time window.
        vm.warp(a.validBefore + 100);
        vm.prank(relayer);
        vm.expectRevert(E_NOT_PAYEE);
        _receiveVrs(a, v, r, s);
        vm.prank(alice); // not even the payer may submit it
        vm.expectRevert(E_NOT_PAYEE);
        _receiveVrs(a, v, r, s);
    }

    function test_receiveWithAuthorization_wrongToRejected() public {
        // Signed for `to = bob`; relayer claims it for itself.
        Auth memory a = _auth(bob, 3e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        Auth memory stolen = Auth(a.from, relayer, a.value, a.validAfter, a.validBefore, a.nonce);
        vm.prank(relayer);
        vm.expectRevert(E_INVALID_SIG);
        _receiveVrs(stolen, v, r, s);
    }

    function test_receiveWithAuthorization_transferSignatureNotAccepted() public {
        Auth memory a = _auth(bob, 3e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.prank(bob);
        vm.expectRevert(E_INVALID_SIG);
        _receiveVrs(a, v, r, s);
    }

    function test_receiveWithAuthorization_timeWindowReplayAndHighS() public {
        Auth memory a = _auth(bob, 3e6, keccak256("n1"));
        a.validAfter = NOW;
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.startPrank(bob);
        vm.expectRevert(E_NOT_YET_VALID);
        _receiveVrs(a, v, r, s);
        vm.warp(a.validBefore);
        vm.expectRevert(E_EXPIRED);
        _receiveVrs(a, v, r, s);
        vm.warp(NOW + 1);
        (uint8 v2, bytes32 r2, bytes32 s2) = _malleate(v, r, s);
        vm.expectRevert(E_S_VALUE);
        _receiveBytes(a, _pack(v2, r2, s2));
        _receiveVrs(a, v, r, s);
        vm.expectRevert(E_USED);
        _receiveVrs(a, v, r, s);
        vm.stopPrank();
    }

    function test_nonceSpaceSharedBetweenTransferAndReceive() public {
        bytes32 nonce = keccak256("shared");
        Auth memory a = _auth(bob, 1e6, nonce);
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.prank(bob);
        _receiveVrs(a, v, r, s);
        (v, r, s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_USED);
        _transferVrs(a, v, r, s);
    }

    // ================================================================== cancelAuthorization

    function _signCancel(uint256 pk, address authorizer, bytes32 nonce)
        internal
        view
        returns (uint8, bytes32, bytes32)
    {
        return vm.sign(pk, _cancelDigest(domain, authorizer, nonce));
    }

    function test_cancelAuthorization_thenUseRejected_vrs() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(ALICE_PK, alice, a.nonce);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit AuthorizationCanceled(alice, a.nonce);
        vm.prank(relayer);
        usdc.cancelAuthorization(alice, a.nonce, cv, cr, cs);
        assertTrue(usdc.authorizationState(alice, a.nonce));

        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_USED);
        _transferVrs(a, v, r, s);
        (v, r, s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.prank(bob);
        vm.expectRevert(E_USED);
        _receiveVrs(a, v, r, s);
        assertEq(usdc.balanceOf(bob), 0);
    }

    function test_cancelAuthorization_bytes() public {
        bytes32 nonce = keccak256("n1");
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(ALICE_PK, alice, nonce);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit AuthorizationCanceled(alice, nonce);
        usdc.cancelAuthorization(alice, nonce, _pack(cv, cr, cs));
        assertTrue(usdc.authorizationState(alice, nonce));
    }

    function test_cancelAuthorization_twiceRejected() public {
        bytes32 nonce = keccak256("n1");
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(ALICE_PK, alice, nonce);
        usdc.cancelAuthorization(alice, nonce, cv, cr, cs);
        vm.expectRevert(E_USED);
        usdc.cancelAuthorization(alice, nonce, cv, cr, cs);
        vm.expectRevert(E_USED);
        usdc.cancelAuthorization(alice, nonce, _pack(cv, cr, cs));
    }

    function test_cancelAuthorization_ofUsedNonceRejected() public {
        Auth memory a = _auth(bob, 1e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        _transferVrs(a, v, r, s);
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(ALICE_PK, alice, a.nonce);
        vm.expectRevert(E_USED);
        usdc.cancelAuthorization(alice, a.nonce, cv, cr, cs);
    }

    function test_cancelAuthorization_wrongSignerRejected() public {
        bytes32 nonce = keccak256("n1");
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(MALLORY_PK, alice, nonce);
        vm.expectRevert(E_INVALID_SIG);
        usdc.cancelAuthorization(alice, nonce, cv, cr, cs);
        vm.expectRevert(E_INVALID_SIG);
        usdc.cancelAuthorization(alice, nonce, _pack(cv, cr, cs));
        // A transfer signature is not a cancel signature.
        Auth memory a = _auth(bob, 1e6, nonce);
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_INVALID_SIG);
        usdc.cancelAuthorization(alice, nonce, v, r, s);
        assertFalse(usdc.authorizationState(alice, nonce));
    }

    function test_cancelAuthorization_highSRejected() public {
        bytes32 nonce = keccak256("n1");
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(ALICE_PK, alice, nonce);
        (uint8 v2, bytes32 r2, bytes32 s2) = _malleate(cv, cr, cs);
        vm.expectRevert(E_S_VALUE);
        usdc.cancelAuthorization(alice, nonce, v2, r2, s2);
        vm.expectRevert(E_SIG_LENGTH);
        usdc.cancelAuthorization(alice, nonce, abi.encodePacked(cr, cs));
    }

    // ================================================================== ERC-1271 (contract signers)

    function test_erc1271_contractWalletCanAuthorize() public {
        MockERC1271Wallet wallet = new MockERC1271Wallet(alice);
        usdc.mint(address(wallet), 50e6);
        Auth memory a = Auth(address(wallet), bob, 5e6, NOW - 1, NOW + 60, keccak256("w1"));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(ALICE_PK, _authDigest(domain, TRANSFER_TYPEHASH, a));
        _transferBytes(a, _pack(v, r, s));
        assertEq(usdc.balanceOf(bob), 5e6);
        assertTrue(usdc.authorizationState(address(wallet), a.nonce));

        // The v,r,s overload goes through ERC-1271 too (packed r||s||v).
        Auth memory b = Auth(address(wallet), bob, 5e6, NOW - 1, NOW + 60, keccak256("w2"));
        (v, r, s) = vm.sign(ALICE_PK, _authDigest(domain, TRANSFER_TYPEHASH, b));
        _transferVrs(b, v, r, s);
        assertEq(usdc.balanceOf(bob), 10e6);

        // Receive and cancel as well.
        Auth memory c = Auth(address(wallet), bob, 1e6, NOW - 1, NOW + 60, keccak256("w3"));
        (v, r, s) = vm.sign(ALICE_PK, _authDigest(domain, RECEIVE_TYPEHASH, c));
        vm.prank(bob);
        _receiveBytes(c, _pack(v, r, s));
        assertEq(usdc.balanceOf(bob), 11e6);
        (v, r, s) = vm.sign(ALICE_PK, _cancelDigest(domain, address(wallet), keccak256("w4")));
        usdc.cancelAuthorization(address(wallet), keccak256("w4"), _pack(v, r, s));
        assertTrue(usdc.authorizationState(address(wallet), keccak256("w4")));
    }

    function test_erc1271_rejections() public {
        MockERC1271Wallet wallet = new MockERC1271Wallet(alice);
        usdc.mint(address(wallet), 50e6);
        Auth memory a = Auth(address(wallet), bob, 5e6, NOW - 1, NOW + 60, keccak256("w1"));

        // Wrong key behind the wallet.
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(MALLORY_PK, _authDigest(domain, TRANSFER_TYPEHASH, a));
        vm.expectRevert(E_INVALID_SIG);
        _transferBytes(a, _pack(v, r, s));

        (v, r, s) = vm.sign(ALICE_PK, _authDigest(domain, TRANSFER_TYPEHASH, a));
        bytes memory good = _pack(v, r, s);

        wallet.setMode(MockERC1271Wallet.Mode.WrongMagic);
        vm.expectRevert(E_INVALID_SIG);
        _transferBytes(a, good);

        wallet.setMode(MockERC1271Wallet.Mode.Reverts);
        vm.expectRevert(E_INVALID_SIG);
        _transferBytes(a, good);

        wallet.setMode(MockERC1271Wallet.Mode.ShortReturn);
        vm.expectRevert(E_INVALID_SIG);
        _transferBytes(a, good);

        // For a contract signer the signature format is the wallet's business: no length/s checks.
        wallet.setMode(MockERC1271Wallet.Mode.AlwaysValid);
        _transferBytes(a, hex"00");
        assertEq(usdc.balanceOf(bob), 5e6);
    }

    // ================================================================== fuzz

    function testFuzz_validAuthorizationTransfers(
        uint256 pk,
        address to,
        uint256 value,
        bytes32 nonce,
        uint32 after_,
        uint32 window
    ) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        address from = vm.addr(pk);
        vm.assume(to != address(0) && to != from);
        value = bound(value, 0, 1e30);
        window = uint32(bound(window, 2, type(uint32).max));
        if (value > 0) usdc.mint(from, value);
        Auth memory a = Auth(from, to, value, uint256(after_), uint256(after_) + window, nonce);
        vm.warp(uint256(after_) + 1);
        (uint8 v, bytes32 r, bytes32 s) = _sign(pk, TRANSFER_TYPEHASH, a);
        uint256 toBefore = usdc.balanceOf(to);
        _transferVrs(a, v, r, s);
        assertEq(usdc.balanceOf(to), toBefore + value);
        assertTrue(usdc.authorizationState(from, nonce));
        vm.expectRevert(E_USED);
        _transferBytes(a, _pack(v, r, s));
    }

    function testFuzz_wrongSignerRejected(uint256 pk, uint256 otherPk, uint256 value, bytes32 nonce) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        otherPk = bound(otherPk, 1, SECP256K1_N - 1);
        vm.assume(pk != otherPk);
        address from = vm.addr(pk);
        value = bound(value, 1, 1e12);
        usdc.mint(from, value);
        Auth memory a = Auth(from, bob, value, NOW - 1, NOW + 1, nonce);
        (uint8 v, bytes32 r, bytes32 s) = _sign(otherPk, TRANSFER_TYPEHASH, a);
        vm.expectRevert(E_INVALID_SIG);
        _transferVrs(a, v, r, s);
        assertFalse(usdc.authorizationState(from, nonce));
    }

    function testFuzz_timeWindowEnforced(uint64 validAfter, uint64 validBefore, uint64 t) public {
        Auth memory a =
            Auth(alice, bob, 1, validAfter, validBefore, keccak256(abi.encode(validAfter, validBefore, t)));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.warp(t);
        if (t <= validAfter) {
            vm.expectRevert(E_NOT_YET_VALID);
        } else if (t >= validBefore) {
            vm.expectRevert(E_EXPIRED);
        }
        _transferVrs(a, v, r, s);
        assertEq(usdc.authorizationState(alice, a.nonce), t > validAfter && t < validBefore);
    }

    function testFuzz_highSAlwaysRejected(uint256 pk, bytes32 nonce, uint256 value) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        address from = vm.addr(pk);
        value = bound(value, 0, 1e12);
        if (value > 0) usdc.mint(from, value);
        Auth memory a = Auth(from, bob, value, NOW - 1, NOW + 1, nonce);
        (uint8 v, bytes32 r, bytes32 s) = _sign(pk, TRANSFER_TYPEHASH, a);
        (uint8 v2, bytes32 r2, bytes32 s2) = _malleate(v, r, s);
        vm.expectRevert(E_S_VALUE);
        _transferVrs(a, v2, r2, s2);
        vm.expectRevert(E_S_VALUE);
        _transferBytes(a, _pack(v2, r2, s2));
        _transferBytes(a, _pack(v, r, s));
    }

    function _vrsCalldata(Auth memory a, uint8 v, bytes32 r, bytes32 s) internal pure returns (bytes memory) {
        return abi.encodeWithSignature(
            "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)",
            a.from,
            a.to,
            a.value,
            a.validAfter,
            a.validBefore,
            a.nonce,
            v,
            r,
            s
        );
    }

    function _bytesCalldata(Auth memory a, bytes memory sig) internal pure returns (bytes memory) {
        return abi.encodeWithSignature(
            "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)",
            a.from,
            a.to,
            a.value,
            a.validAfter,
            a.validBefore,
            a.nonce,
            sig
        );
    }

    struct Outcome {
        bool ok;
        bytes ret;
        uint256 bobBalance;
        bool used;
    }

    /// Runs `data` against the token and rolls the state back afterwards.
    function _tryAndRollBack(bytes memory data, bytes32 nonce) internal returns (Outcome memory o) {
        uint256 snap = vm.snapshotState();
        (o.ok, o.ret) = address(usdc).call(data);
        o.bobBalance = usdc.balanceOf(bob);
        o.used = usdc.authorizationState(alice, nonce);
        vm.revertToState(snap);
    }

    /// The bytes and v,r,s overloads accept and reject exactly the same inputs with the same effects.
    function testFuzz_bytesAndVrsOverloadsEquivalent(
        uint256 value,
        bytes32 nonce,
        bool corruptS,
        bool wrongKey,
        uint8 vDelta
    ) public {
        value = bound(value, 0, 2_000e6); // sometimes more than alice has
        Auth memory a = _auth(bob, value, nonce);
        (uint8 v, bytes32 r, bytes32 s) = _sign(wrongKey ? MALLORY_PK : ALICE_PK, TRANSFER_TYPEHASH, a);
        if (corruptS) (v, r, s) = _malleate(v, r, s);
        if (vDelta % 4 == 1) v = v - 27;

        Outcome memory viaVrs = _tryAndRollBack(_vrsCalldata(a, v, r, s), nonce);
        Outcome memory viaBytes = _tryAndRollBack(_bytesCalldata(a, _pack(v, r, s)), nonce);
        assertEq(viaVrs.ok, viaBytes.ok);
        assertEq(viaVrs.ret, viaBytes.ret);
        assertEq(viaVrs.bobBalance, viaBytes.bobBalance);
        assertEq(viaVrs.used, viaBytes.used);
        assertEq(viaVrs.ok, !wrongKey && !corruptS && vDelta % 4 != 1 && value <= 1_000e6);
        if (viaVrs.ok) assertEq(viaVrs.bobBalance, value);
    }

    function testFuzz_cancelThenUseRejected(bytes32 nonce, uint256 value, bool useReceive) public {
        value = bound(value, 0, 1_000e6);
        (uint8 cv, bytes32 cr, bytes32 cs) = _signCancel(ALICE_PK, alice, nonce);
        usdc.cancelAuthorization(alice, nonce, cv, cr, cs);
        Auth memory a = _auth(bob, value, nonce);
        if (useReceive) {
            (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
            vm.prank(bob);
            vm.expectRevert(E_USED);
            _receiveVrs(a, v, r, s);
        } else {
            (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
            vm.expectRevert(E_USED);
            _transferBytes(a, _pack(v, r, s));
        }
        assertEq(usdc.balanceOf(bob), 0);
    }

    function testFuzz_receiveWrongCallerRejected(address caller, bytes32 nonce) public {
        vm.assume(caller != bob);
        Auth memory a = _auth(bob, 1e6, nonce);
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, RECEIVE_TYPEHASH, a);
        vm.prank(caller);
        vm.expectRevert(E_NOT_PAYEE);
        _receiveBytes(a, _pack(v, r, s));
    }

    function testFuzz_erc20TransferConservesSupply(uint256 amount, address to) public {
        vm.assume(to != address(0));
        amount = bound(amount, 0, 1_000e6);
        uint256 sumBefore = usdc.balanceOf(alice) + (to == alice ? 0 : usdc.balanceOf(to));
        vm.prank(alice);
        usdc.transfer(to, amount);
        uint256 sumAfter = usdc.balanceOf(alice) + (to == alice ? 0 : usdc.balanceOf(to));
        assertEq(sumAfter, sumBefore);
        assertEq(usdc.totalSupply(), 1_000e6);
    }

    /// Logs: a successful authorization emits exactly AuthorizationUsed then Transfer.
    function test_transferWithAuthorization_logsExactly() public {
        Auth memory a = _auth(bob, 2e6, keccak256("n1"));
        (uint8 v, bytes32 r, bytes32 s) = _sign(ALICE_PK, TRANSFER_TYPEHASH, a);
        vm.recordLogs();
        _transferVrs(a, v, r, s);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        assertEq(logs.length, 2);
        assertEq(logs[0].topics[0], keccak256("AuthorizationUsed(address,bytes32)"));
        assertEq(logs[0].topics[1], bytes32(uint256(uint160(alice))));
        assertEq(logs[0].topics[2], a.nonce);
        assertEq(logs[1].topics[0], keccak256("Transfer(address,address,uint256)"));
    }
}
